export { LlmBackendPool, type LlmBackendPoolOptions, type LlmBackendStats, type LlmChatOptions, type LlmRequestEvent } from './backend-pool.ts';
export { chatCompletion, chatRequestBody, createLlmAgent } from './chat-completion.ts';
export { parseHermesGeneration, type ParsedGeneration } from './hermes-parser.ts';
export { LlmBackendError, type LlmBackendErrorOptions, type LlmFailureKind } from './llm-error.ts';
export { tokenCompletion, tokenCompletionBody, tokenizeChat } from './token-completion.ts';
export { TokenConversation } from './token-conversation.ts';
export type * from './types.ts';
export { Weights, type PauseMode, type PauseOutcome, type WeightState } from './weights.ts';
