"""The prompt: a chunk of tokens per forward through the streamed layers, its reads, its memory.

Owns `chunks` (the chunked prefill and one chunk's state), `chunk_moe` (a streamed
layer over a chunk, its union of experts staged in groups), `ahead` (what a chunk
reads early of the next layer), `dense` (resident int4 linears as one fp32 matmul
over a chunk) and `memory` (what a chunk holds, the sub-chunked recurrence that
bounds it). Of the runtime, may import compute, layers and io; compute reaches a
chunk only through the step clock's `chunk` (a ChunkState), never by import.
"""
