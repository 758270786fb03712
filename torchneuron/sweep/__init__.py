"""The Hugging Face architecture sweep: every architecture of a task, tiny, on CPU and on neuron.

    python -m torchneuron.sweep [--task masked-lm] [--only bert,roberta] [--jobs 2] [--timeout 120] [--out sweep-out]

See docs/SWEEP.md.
"""
