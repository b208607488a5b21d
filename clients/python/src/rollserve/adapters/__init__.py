"""Trainer adapters, one module per framework, each imported on its own (``import
rollserve.adapters.verl``) so that nothing here loads a framework the trainer does not use:
``verl`` (an agent loop), ``skyrl`` (a generator), ``nemo_rl`` (NeMo-RL over the service's NeMo
Gym agent face). Each imports its framework when present and otherwise falls back to the shapes
the framework's code declares (see the README, "Trainer adapters")."""
