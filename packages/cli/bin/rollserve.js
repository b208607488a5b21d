#!/usr/bin/env node
// citty colours --help unless NO_COLOR (or TERM=dumb, CI) is set, even into a pipe or a file: no
// colour codes where the output is not a terminal, as `rollserve --help | less` or `> help.txt` expect.
// Set before citty is loaded (it reads the environment once); FORCE_COLOR keeps the colours.
if (!process.stdout.isTTY && process.env.NO_COLOR === undefined && process.env.FORCE_COLOR === undefined) process.env.NO_COLOR = '1';
await import('../dist/main.js');
