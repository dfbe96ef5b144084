"""`edge0 tune`: routing heads trained and validated on the user's machine, inside its budget."""
