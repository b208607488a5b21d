// `@rollserve/core/node`: a rollout node (`startRolloutNode`), its HTTP client of the service and
// the policy it reaches through the service. Loading it loads neither the service nor the store.
export * from '../node/index.ts';
