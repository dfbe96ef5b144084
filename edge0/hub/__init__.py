"""Models named by Hugging Face Hub id: download through `huggingface_hub`, convert once, cache."""
