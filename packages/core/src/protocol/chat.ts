// The chat messages and model turns the runner, the LLM clients and the node protocol share.

/** An OpenAI chat message as vLLM's chat completions take it. */
export type ChatMessage =
  | { role: 'system' | 'user' | 'developer'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: ChatToolCall[]; reasoning_content?: string }
  | { role: 'tool'; tool_call_id: string; content: string };

export interface ChatToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export interface ChatTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown> };
}

/** What the agent loop needs from one model call (the LLM client's result). */
export interface ModelTurn {
  content: string | null;
  reasoning: string | null;
  toolCalls: Array<{ id: string; name: string; arguments: string }>;
  finishReason: string | null;
  promptTokenIds: number[] | null;
  generationTokenIds: number[] | null;
  generationLogprobs: number[] | null;
  usage: { promptTokens: number; completionTokens: number };
  backend: string | null;
  latencyMs: number;
  /** The weight version of the backend that generated it (announced by the trainer), null when none. */
  weightVersion: number | null;
  /** How long the turn waited for a pause of generation (a weight update) to end before it ran; not the policy's time. */
  pausedMs: number;
}

/**
 * Calls the policy for one turn of one rollout. `messages` only grow between calls (the assistant
 * reply, then its tool outputs), which lets a token-in model (`policy.generation: 'tokens'`, see
 * TokenConversation) keep the conversation as token ids and tokenize only what was appended.
 */
export type CallModel = (request: { messages: ChatMessage[]; tools: ChatTool[] }, signal: AbortSignal) => Promise<ModelTurn>;
