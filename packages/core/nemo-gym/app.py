"""NeMo Gym entrypoint of a rollserve environment: hands the process over to Node.

NeMo Gym runs `python app.py` inside resources_servers/<name>/ with NEMO_GYM_CONFIG_DICT and
NEMO_GYM_CONFIG_PATH set; this shim execs core's launcher (rollserve-gym, what `rollserve nemo-gym`
does without the CLI and the service's store drivers) on the environment package, which reads them,
binds the configured host:port and serves the resources-server contract.
Each environment's nemo-gym/app.py is a symlink to this file.
"""

import os
import shutil
import sys
from pathlib import Path

# NeMo Gym runs `cd resources_servers/<name> && python app.py`: the directory of the symlink,
# resolved, is <package>/nemo-gym (the file itself resolves into core, so it is not followed).
here = Path(sys.argv[0]).absolute().parent.resolve()
package = here.parent
launcher = package / "node_modules" / "@rollserve" / "core" / "bin" / "rollserve-gym.js"
node = os.environ.get("ROLLSERVE_NODE") or shutil.which("node")
if node is None:
    sys.exit("rollserve: node (20.19 or newer) is not on PATH; set ROLLSERVE_NODE")
if not launcher.exists():
    sys.exit(f"rollserve: {launcher} is missing: run `pnpm install && pnpm build` in the rollserve checkout")
os.execv(node, [node, str(launcher), str(package)])
