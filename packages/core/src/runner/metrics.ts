import { Counter, Gauge, Histogram, Registry } from 'prom-client';

export interface ServiceMetrics {
  registry: Registry;
  stageLatency: Histogram<'stage'>;
  toolLatency: Histogram<'tool' | 'status'>;
  llmLatency: Histogram;
  finished: Counter<'state' | 'critical_error'>;
}

type StatusSource = () => {
  stages: Record<string, { queued: number; active: number; pool: number }>;
  live_sessions: number;
  live_sandboxes: number;
  /** Rollout nodes up (a runner alone has none). */
  nodes?: number;
  rollouts?: { in_flight: number };
};

/** The service's Prometheus metrics, in a registry of its own (GET /metrics). */
export function createServiceMetrics(status: StatusSource): ServiceMetrics {
  const registry = new Registry();
  const seconds = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300];
  new Gauge({
    name: 'rollserve_stage_queue_depth',
    help: 'Rollouts waiting for a slot in each stage',
    labelNames: ['stage'],
    registers: [registry],
    collect() {
      for (const [stage, s] of Object.entries(status().stages)) this.set({ stage }, s.queued);
    },
  });
  new Gauge({
    name: 'rollserve_stage_active',
    help: 'Rollouts holding a slot in each stage',
    labelNames: ['stage'],
    registers: [registry],
    collect() {
      for (const [stage, s] of Object.entries(status().stages)) this.set({ stage }, s.active);
    },
  });
  new Gauge({
    name: 'rollserve_live_sessions',
    help: 'Rollout sessions holding state or resources (sandboxes, kernels)',
    registers: [registry],
    collect() {
      this.set(status().live_sessions);
    },
  });
  new Gauge({
    name: 'rollserve_nodes_up',
    help: 'Rollout nodes registered and heartbeating (0: the service runs rollouts itself)',
    registers: [registry],
    collect() {
      this.set(status().nodes ?? 0);
    },
  });
  new Gauge({
    name: 'rollserve_rollouts_in_flight',
    help: 'Rollouts accepted and not finished: queued in the store, leased to a node, or running here',
    registers: [registry],
    collect() {
      this.set(status().rollouts?.in_flight ?? 0);
    },
  });
  new Gauge({
    name: 'rollserve_live_sandboxes',
    help: 'Sandboxes open for rollouts',
    registers: [registry],
    collect() {
      this.set(status().live_sandboxes);
    },
  });
  return {
    registry,
    stageLatency: new Histogram({ name: 'rollserve_stage_seconds', help: 'Time a rollout spends active in a stage', labelNames: ['stage'], buckets: seconds, registers: [registry] }),
    toolLatency: new Histogram({ name: 'rollserve_tool_call_seconds', help: 'Tool call duration', labelNames: ['tool', 'status'], buckets: seconds, registers: [registry] }),
    llmLatency: new Histogram({ name: 'rollserve_llm_call_seconds', help: 'Policy model call duration', buckets: seconds, registers: [registry] }),
    finished: new Counter({ name: 'rollserve_rollouts_finished_total', help: 'Finished rollouts', labelNames: ['state', 'critical_error'], registers: [registry] }),
  };
}

/** Gauges of the weight versions and pauses for weight updates (asynchronous RL), on `registry`. */
export function registerWeightMetrics(registry: Registry, weights: { readonly newest: number | null; readonly paused: boolean; readonly inFlight: number }): void {
  new Gauge({
    name: 'rollserve_weight_version_newest',
    help: 'The newest weight version the trainer announced (-1 before any)',
    registers: [registry],
    collect() {
      this.set(weights.newest ?? -1);
    },
  });
  new Gauge({
    name: 'rollserve_generation_paused',
    help: 'Whether generation is paused for a weight update (1) or not (0)',
    registers: [registry],
    collect() {
      this.set(weights.paused ? 1 : 0);
    },
  });
  new Gauge({
    name: 'rollserve_generations_in_flight',
    help: 'Policy generations under way',
    registers: [registry],
    collect() {
      this.set(weights.inFlight);
    },
  });
}
