// The Python client's models (clients/python/src/rollserve/models.py) against the OpenAPI
// document's components they read: each dataclass field is a property of its component and each
// property a field, Optional exactly where the property is nullable or not required, and of the
// same kind (a string is `str`, an integer `int`, a component with a model that model). A field
// added to a result on one side only fails here.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startRolloutServer, type RolloutServer } from '@rollserve/core/service';
import { counterEnvironment } from '@rollserve/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PYTHON = '/usr/bin/python3';

/** Each model of models.py and where its component is in the document (a component, or a path into one). */
const MODELS: Record<string, string> = {
  Result: 'RolloutResult',
  TrainingView: 'TrainingView',
  Rollout: 'RolloutView',
  TaskRollouts: 'TaskRollouts',
  Group: 'RolloutGroup',
  Page: 'RolloutPage',
  SubmittedTask: 'Submitted.properties.tasks.items',
  Sampling: 'SamplingStatus',
};
/** Fields that are the client's own, not the service's. */
// (SubmittedTask.warnings: the warnings of its batch's 202 that concern it, sorted out client-side)
const CLIENT_FIELDS = new Set(['raw', 'warnings']);

type Kind = { type: 'string' | 'integer' | 'number' | 'boolean' | 'object' | 'any' } | { type: 'array'; items: Kind } | { type: 'model'; name: string };
interface PyField {
  name: string;
  optional: boolean;
  kind: Kind;
}

/** Every dataclass of rollserve.models with its fields' names, optionality and kinds (`typing.get_type_hints`). */
const DUMP = `
import dataclasses, json, typing
import rollserve.models as models

def kind(t):
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is typing.Any: return {"type": "any"}
    if origin in (list, typing.List): return {"type": "array", "items": kind(args[0]) if args else {"type": "any"}}
    if origin in (dict, typing.Dict): return {"type": "object"}
    if dataclasses.is_dataclass(t): return {"type": "model", "name": t.__name__}
    return {"type": {str: "string", int: "integer", float: "number", bool: "boolean"}.get(t, repr(t))}

def field(name, t):
    args = typing.get_args(t)
    optional = typing.get_origin(t) is typing.Union and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        t = rest[0] if len(rest) == 1 else typing.Any
    return {"name": name, "optional": optional, "kind": kind(t)}

out = {}
for name in dir(models):
    cls = getattr(models, name)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == models.__name__:
        hints = typing.get_type_hints(cls)
        out[name] = [field(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
print(json.dumps(out))
`;

type Schema = Record<string, any>;
let server: RolloutServer;
let doc: { components: { schemas: Record<string, Schema> } };
let python: Record<string, PyField[]>;

beforeAll(async () => {
  server = await startRolloutServer({ environments: [counterEnvironment], defaultModel: 'fake-policy' });
  doc = (await (await fetch(`${server.url}/openapi.json`)).json()) as typeof doc;
  const run = spawnSync(PYTHON, ['-c', DUMP], { env: { ...process.env, PYTHONPATH: `${ROOT}clients/python/src` }, encoding: 'utf8' });
  if (run.status !== 0) throw new Error(`python3 could not read the models: ${run.stderr}`);
  python = JSON.parse(run.stdout) as Record<string, PyField[]>;
}, 60_000);

afterAll(async () => {
  await server?.close();
});

/** The schema at `where`: a component name, then property path segments. */
function schemaAt(where: string): Schema {
  const [component, ...path] = where.split('.');
  let schema: Schema | undefined = doc.components.schemas[component!];
  for (const step of path) schema = schema?.[step];
  expect(schema, `${where} is not in the document`).toBeDefined();
  return schema!;
}

const modelOf = (component: string) => Object.entries(MODELS).find(([, where]) => where === component)?.[0];

/** A property schema's nullability and kind as a Python annotation would say them. */
function describe_(schema: Schema): { nullable: boolean; kind: Kind } {
  const parts: Schema[] = schema.allOf ?? schema.anyOf ?? schema.oneOf ?? [schema];
  let nullable = false;
  let kind: Kind | undefined;
  for (const part of parts) {
    const types: string[] = Array.isArray(part.type) ? part.type : part.type ? [part.type] : [];
    if (types.includes('null') || part.nullable === true) nullable = true;
    if (part.$ref) {
      const component = String(part.$ref).split('/').pop()!;
      // (a component first met as nullable is declared nullable itself: Credit)
      const target = doc.components.schemas[component] ?? {};
      if (Array.isArray(target.type) && target.type.includes('null')) nullable = true;
      const model = modelOf(component);
      kind = model ? { type: 'model', name: model } : { type: 'object' };
      continue;
    }
    const type = types.find((t) => t !== 'null');
    if (type === 'array') kind = { type: 'array', items: part.items ? describe_(part.items).kind : { type: 'any' } };
    else if (type) kind ??= { type: type as 'string' };
  }
  return { nullable, kind: kind ?? { type: 'any' } };
}

/** Whether a Python kind fits the document's (`Any` fits anything). */
function fits(py: Kind, api: Kind): boolean {
  if (py.type === 'any' || api.type === 'any') return true;
  if (py.type === 'array' && api.type === 'array') return fits(py.items, api.items);
  if (py.type === 'model' && api.type === 'model') return py.name === api.name;
  return py.type === api.type;
}

describe('the Python client models against the OpenAPI document', () => {
  it('maps every dataclass of models.py to the component it reads', () => {
    expect(Object.keys(python).sort()).toEqual(Object.keys(MODELS).sort());
  });

  for (const [model, where] of Object.entries(MODELS)) {
    it(`${model} has the fields of ${where}, Optional where the document allows null or omits them`, () => {
      const schema = schemaAt(where);
      const properties = (schema.properties ?? {}) as Record<string, Schema>;
      const required = new Set<string>(schema.required ?? []);
      const fields = python[model]!.filter((f) => !CLIENT_FIELDS.has(f.name));
      expect(fields.map((f) => f.name).sort(), `${model}'s fields against ${where}'s properties`).toEqual(Object.keys(properties).sort());
      for (const field of fields) {
        const { nullable, kind } = describe_(properties[field.name]!);
        expect(field.optional, `${model}.${field.name}: Optional exactly when ${where}.${field.name} is nullable or not required`).toBe(nullable || !required.has(field.name));
        expect(fits(field.kind, kind), `${model}.${field.name} is ${JSON.stringify(field.kind)}, the document says ${JSON.stringify(kind)}`).toBe(true);
      }
    });
  }
});
