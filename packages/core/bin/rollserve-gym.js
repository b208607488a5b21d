#!/usr/bin/env node
// What an environment's nemo-gym/app.py runs: one environment as a NeMo Gym resources server,
// without the rollserve CLI (@rollserve/cli) and what only the service needs.
import '../dist/gym/nemo-gym-main.js';
