"""The Hugging Face causal-LM architecture sweep: every architecture, tiny, on CPU and on neuron.

    python -m torchneuron.sweep [--only llama,gpt2] [--jobs 2] [--timeout 120] [--out sweep-out]

See docs/SWEEP.md.
"""
