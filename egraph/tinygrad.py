"""The bridge's public name: `-p egraph.tinygrad` (the pytest plugin), `from egraph import tinygrad as bridge`,
`import egraph.tinygrad`. The module is egraph/bridge/install.py; this name is an alias of it (the same module object,
so patching a name through either one patches the bridge)."""
import sys
from egraph.bridge import install

sys.modules[__name__] = install
