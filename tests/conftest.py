import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# compiled programs kept on disk as every roofcal command keeps them (ROOFCAL_CACHE; "off": none),
# set before JAX is imported: a process whose first program compiles without the cache never
# reads it afterwards, so the tests compiled most programs afresh in every worker
from roofcal.cli.main import enable_compilation_cache  # noqa: E402

enable_compilation_cache()
