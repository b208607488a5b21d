// `@rollserve/core/sandbox`: sandbox providers (bwrap, Apptainer, local), their specs and limits,
// images, and the tool backends that run in a sandbox (bash on a PTY, the Python kernel, the editor).
export * from '../sandbox/index.ts';
export * from '../tools/index.ts';
