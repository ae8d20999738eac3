"""The export: a run's weights, config and tokenizer in the Hugging Face Llama layout (``folder``
writes and reads it; ``hf`` names and orders the tensors; ``safetensors_writer`` streams the weight
files; ``tokenizer_files`` writes the tokenizer)."""
