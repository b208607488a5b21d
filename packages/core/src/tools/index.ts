export { BashSession, stripAnsi } from './bash.ts';
export type { BashResult, BashSessionOptions } from './bash.ts';
export { KERNEL_SOURCE_PATH, PythonKernel } from './python.ts';
export type { PythonError, PythonKernelOptions, PythonResult } from './python.ts';
export { EDITOR_COMMANDS, Editor } from './editor.ts';
export type { EditorArgs, EditorCommand, EditorResult } from './editor.ts';
export { createSessionTools, SessionTools } from './session-tools.ts';
export type { SessionPythonOptions, SessionToolsOptions } from './session-tools.ts';
