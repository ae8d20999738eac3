"""The models a run trains: the built-in Llama-style presets (``llama``), a user's
``module:function`` builder or a preset (``builder``), and Hugging Face ``transformers`` models
(``hf``)."""
