"""Hugging Face model directories: a job's architecture from ``config.json``, a stage's weights from
``*.safetensors`` (only its own tensors read), and a checkpoint written back as a directory
``transformers`` loads. potluck never imports ``transformers``: these are file formats."""
