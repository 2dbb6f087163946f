# Loads qual's pytest plugin for runs from the source tree when qual is not installed (an
# installed qual registers it through its pytest11 entry point).
from importlib import metadata

if not any(ep.value == "qual.plugin.hooks" for ep in metadata.entry_points(group="pytest11")):
    pytest_plugins = ["qual.plugin.hooks"]
