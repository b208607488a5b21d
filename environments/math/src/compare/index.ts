export { answersEqual } from './answers.ts';
export { getEngine } from './engine.ts';
