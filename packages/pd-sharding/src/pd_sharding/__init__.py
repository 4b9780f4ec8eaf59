"""pd-sharding: device meshes, the ZeRO-1 layout, placement and memory estimates.

pd-sharding knows array roles (component factors, CI params, frozen target weights, batches),
not configs or models; callers pass shapes and get shardings back.
"""

from pd_sharding._batch import batch_to_host, global_batch, local_rows
from pd_sharding._errors import MeshError, ShardingError
from pd_sharding._layout import REPLICATE, Zero1Layout, path_name
from pd_sharding._memory import ArrayGroup, MemoryRow, memory_estimate, memory_table
from pd_sharding._mesh import AXES, DATA_AXES, abstract_mesh, axis_sizes, make_mesh
from pd_sharding._optstate import opt_state_shardings
from pd_sharding._place import place, restore_targets, zeros_like_sharded
from pd_sharding._spec import check_spec

__version__ = "0.1.0"

__all__ = [
    "AXES",
    "DATA_AXES",
    "REPLICATE",
    "ArrayGroup",
    "MemoryRow",
    "MeshError",
    "ShardingError",
    "Zero1Layout",
    "__version__",
    "abstract_mesh",
    "axis_sizes",
    "batch_to_host",
    "check_spec",
    "global_batch",
    "local_rows",
    "make_mesh",
    "memory_estimate",
    "memory_table",
    "opt_state_shardings",
    "path_name",
    "place",
    "restore_targets",
    "zeros_like_sharded",
]
