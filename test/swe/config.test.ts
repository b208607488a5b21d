import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { resolveInstance, SweConfig, SweRow } from '@rollserve/env-swe';
import { readJsonl, workspaceRoot } from '@rollserve/testing';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';

// The package's NeMo Gym config and example data fit together: each SWE-bench row resolves to its
// instance image with the repository at /testbed.

const dir = join(workspaceRoot(), 'environments', 'swe');

describe('swe NeMo Gym config and example data', () => {
  it('the YAML block is a valid config and names every example instance image', () => {
    const yaml = parse(readFileSync(join(dir, 'nemo-gym', 'configs', 'swe.yaml'), 'utf8')) as { swe: { resources_servers: { swe: Record<string, unknown> } } };
    const config = SweConfig.parse(yaml.swe.resources_servers.swe);
    expect(config.sandbox_provider).toEqual({ apptainer: { applyResourceLimits: false, extraStartArgs: ['--fakeroot'] } });
    const rows = readJsonl(join(dir, 'data', 'example.jsonl'));
    expect(rows).toHaveLength(5);
    for (const raw of rows) {
      const instance = resolveInstance(SweRow.parse(raw), config);
      expect(instance.image).toBe(`docker://swebench/sweb.eval.x86_64.${String(raw.instance_id).replace('__', '_1776_')}:latest`);
      expect(instance.repoDir).toBe('/testbed');
      expect(instance.failToPass.length).toBeGreaterThan(0);
      // SWE-bench's astropy spec, on the test files of the row's test_patch
      expect(instance).toMatchObject({ testCommand: 'pytest -rA', testCommandFrom: 'swe-bench', parserName: 'pytest_v2' });
      expect(instance.testTargets.length).toBeGreaterThan(0);
      for (const target of instance.testTargets) expect(String(raw.test_patch)).toContain(`diff --git a/${target} b/${target}`);
    }
  });
});
