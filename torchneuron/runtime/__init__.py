"""The runtime: NeuronCores (PJRT devices through JAX), storages, memory, synchronisation, generators."""
