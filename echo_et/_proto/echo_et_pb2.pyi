from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GroupRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNKNOWN: _ClassVar[GroupRole]
    ROLE_WORLD: _ClassVar[GroupRole]
    ROLE_DP: _ClassVar[GroupRole]
    ROLE_TP: _ClassVar[GroupRole]
    ROLE_PP: _ClassVar[GroupRole]
    ROLE_EP: _ClassVar[GroupRole]
    ROLE_CP: _ClassVar[GroupRole]
    ROLE_CUSTOM: _ClassVar[GroupRole]

class StreamKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_UNKNOWN: _ClassVar[StreamKind]
    STREAM_CPU_THREAD: _ClassVar[StreamKind]
    STREAM_GPU_COMPUTE: _ClassVar[StreamKind]
    STREAM_GPU_COMM: _ClassVar[StreamKind]
    STREAM_GPU_COPY: _ClassVar[StreamKind]

class NodeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KIND_UNKNOWN: _ClassVar[NodeKind]
    KIND_COMPUTE: _ClassVar[NodeKind]
    KIND_COLLECTIVE: _ClassVar[NodeKind]
    KIND_SEND: _ClassVar[NodeKind]
    KIND_RECV: _ClassVar[NodeKind]
    KIND_CPU_OP: _ClassVar[NodeKind]
    KIND_LAUNCH: _ClassVar[NodeKind]
    KIND_MEMCPY: _ClassVar[NodeKind]
    KIND_MEMSET: _ClassVar[NodeKind]
    KIND_SYNC: _ClassVar[NodeKind]
    KIND_COMM_UNKNOWN: _ClassVar[NodeKind]

class DepKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEP_DATA: _ClassVar[DepKind]
    DEP_LAUNCH: _ClassVar[DepKind]
    DEP_SYNC: _ClassVar[DepKind]
    DEP_CONTROL: _ClassVar[DepKind]

class KernelClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KC_OTHER: _ClassVar[KernelClass]
    KC_GEMM: _ClassVar[KernelClass]
    KC_ATTENTION: _ClassVar[KernelClass]
    KC_ELEMENTWISE: _ClassVar[KernelClass]
    KC_REDUCTION: _ClassVar[KernelClass]
    KC_NORM: _ClassVar[KernelClass]
    KC_OPTIMIZER: _ClassVar[KernelClass]
    KC_MEMCPY: _ClassVar[KernelClass]
    KC_CONV: _ClassVar[KernelClass]
    KC_EMBEDDING: _ClassVar[KernelClass]

class CollectiveType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLL_UNKNOWN: _ClassVar[CollectiveType]
    COLL_ALL_REDUCE: _ClassVar[CollectiveType]
    COLL_ALL_GATHER: _ClassVar[CollectiveType]
    COLL_REDUCE_SCATTER: _ClassVar[CollectiveType]
    COLL_ALL_TO_ALL: _ClassVar[CollectiveType]
    COLL_BROADCAST: _ClassVar[CollectiveType]
    COLL_REDUCE: _ClassVar[CollectiveType]
    COLL_GATHER: _ClassVar[CollectiveType]
    COLL_SCATTER: _ClassVar[CollectiveType]
    COLL_BARRIER: _ClassVar[CollectiveType]
ROLE_UNKNOWN: GroupRole
ROLE_WORLD: GroupRole
ROLE_DP: GroupRole
ROLE_TP: GroupRole
ROLE_PP: GroupRole
ROLE_EP: GroupRole
ROLE_CP: GroupRole
ROLE_CUSTOM: GroupRole
STREAM_UNKNOWN: StreamKind
STREAM_CPU_THREAD: StreamKind
STREAM_GPU_COMPUTE: StreamKind
STREAM_GPU_COMM: StreamKind
STREAM_GPU_COPY: StreamKind
KIND_UNKNOWN: NodeKind
KIND_COMPUTE: NodeKind
KIND_COLLECTIVE: NodeKind
KIND_SEND: NodeKind
KIND_RECV: NodeKind
KIND_CPU_OP: NodeKind
KIND_LAUNCH: NodeKind
KIND_MEMCPY: NodeKind
KIND_MEMSET: NodeKind
KIND_SYNC: NodeKind
KIND_COMM_UNKNOWN: NodeKind
DEP_DATA: DepKind
DEP_LAUNCH: DepKind
DEP_SYNC: DepKind
DEP_CONTROL: DepKind
KC_OTHER: KernelClass
KC_GEMM: KernelClass
KC_ATTENTION: KernelClass
KC_ELEMENTWISE: KernelClass
KC_REDUCTION: KernelClass
KC_NORM: KernelClass
KC_OPTIMIZER: KernelClass
KC_MEMCPY: KernelClass
KC_CONV: KernelClass
KC_EMBEDDING: KernelClass
COLL_UNKNOWN: CollectiveType
COLL_ALL_REDUCE: CollectiveType
COLL_ALL_GATHER: CollectiveType
COLL_REDUCE_SCATTER: CollectiveType
COLL_ALL_TO_ALL: CollectiveType
COLL_BROADCAST: CollectiveType
COLL_REDUCE: CollectiveType
COLL_GATHER: CollectiveType
COLL_SCATTER: CollectiveType
COLL_BARRIER: CollectiveType

class Layout(_message.Message):
    __slots__ = ("dp", "tp", "pp", "vpp", "ep", "cp", "microbatches", "zero_stage", "source")
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    VPP_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    ZERO_STAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    dp: int
    tp: int
    pp: int
    vpp: int
    ep: int
    cp: int
    microbatches: int
    zero_stage: int
    source: str
    def __init__(self, dp: _Optional[int] = ..., tp: _Optional[int] = ..., pp: _Optional[int] = ..., vpp: _Optional[int] = ..., ep: _Optional[int] = ..., cp: _Optional[int] = ..., microbatches: _Optional[int] = ..., zero_stage: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class Hardware(_message.Message):
    __slots__ = ("gpu_name", "gpus_per_node", "intra_node_bw_gbps", "inter_node_bw_gbps", "nics_per_node")
    GPU_NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    INTRA_NODE_BW_GBPS_FIELD_NUMBER: _ClassVar[int]
    INTER_NODE_BW_GBPS_FIELD_NUMBER: _ClassVar[int]
    NICS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    gpu_name: str
    gpus_per_node: int
    intra_node_bw_gbps: float
    inter_node_bw_gbps: float
    nics_per_node: int
    def __init__(self, gpu_name: _Optional[str] = ..., gpus_per_node: _Optional[int] = ..., intra_node_bw_gbps: _Optional[float] = ..., inter_node_bw_gbps: _Optional[float] = ..., nics_per_node: _Optional[int] = ...) -> None: ...

class ProcessGroup(_message.Message):
    __slots__ = ("id", "name", "desc", "ranks", "role")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    desc: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    role: GroupRole
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., desc: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., role: _Optional[_Union[GroupRole, str]] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("source_format", "tool_version", "command", "inputs")
    SOURCE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    TOOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    source_format: str
    tool_version: str
    command: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, source_format: _Optional[str] = ..., tool_version: _Optional[str] = ..., command: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ...) -> None: ...

class GraphRef(_message.Message):
    __slots__ = ("id", "path", "nodes", "sha256")
    ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    id: str
    path: str
    nodes: int
    sha256: str
    def __init__(self, id: _Optional[str] = ..., path: _Optional[str] = ..., nodes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class RankBinding(_message.Message):
    __slots__ = ("rank", "graph", "groups", "measured_step_ns", "clock_offset_ns")
    class GroupsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RANK_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_STEP_NS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    graph: str
    groups: _containers.ScalarMap[str, int]
    measured_step_ns: int
    clock_offset_ns: int
    def __init__(self, rank: _Optional[int] = ..., graph: _Optional[str] = ..., groups: _Optional[_Mapping[str, int]] = ..., measured_step_ns: _Optional[int] = ..., clock_offset_ns: _Optional[int] = ...) -> None: ...

class JobManifest(_message.Message):
    __slots__ = ("schema_version", "name", "world_size", "layout", "hardware", "groups", "graphs", "bindings", "provenance", "dropped", "attrs", "step")
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    schema_version: str
    name: str
    world_size: int
    layout: Layout
    hardware: Hardware
    groups: _containers.RepeatedCompositeFieldContainer[ProcessGroup]
    graphs: _containers.RepeatedCompositeFieldContainer[GraphRef]
    bindings: _containers.RepeatedCompositeFieldContainer[RankBinding]
    provenance: Provenance
    dropped: _containers.ScalarMap[str, int]
    attrs: _containers.ScalarMap[str, str]
    step: int
    def __init__(self, schema_version: _Optional[str] = ..., name: _Optional[str] = ..., world_size: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., hardware: _Optional[_Union[Hardware, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[ProcessGroup, _Mapping]]] = ..., graphs: _Optional[_Iterable[_Union[GraphRef, _Mapping]]] = ..., bindings: _Optional[_Iterable[_Union[RankBinding, _Mapping]]] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ..., dropped: _Optional[_Mapping[str, int]] = ..., attrs: _Optional[_Mapping[str, str]] = ..., step: _Optional[int] = ...) -> None: ...

class Stream(_message.Message):
    __slots__ = ("id", "name", "kind", "device", "native_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NATIVE_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    kind: StreamKind
    device: int
    native_id: int
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[StreamKind, str]] = ..., device: _Optional[int] = ..., native_id: _Optional[int] = ...) -> None: ...

class GraphHeader(_message.Message):
    __slots__ = ("schema_version", "id", "name", "streams", "group_sizes", "attrs", "repeats")
    class GroupSizesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZES_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    schema_version: str
    id: str
    name: str
    streams: _containers.RepeatedCompositeFieldContainer[Stream]
    group_sizes: _containers.ScalarMap[str, int]
    attrs: _containers.ScalarMap[str, str]
    repeats: _containers.RepeatedCompositeFieldContainer[RepeatBlock]
    def __init__(self, schema_version: _Optional[str] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., streams: _Optional[_Iterable[_Union[Stream, _Mapping]]] = ..., group_sizes: _Optional[_Mapping[str, int]] = ..., attrs: _Optional[_Mapping[str, str]] = ..., repeats: _Optional[_Iterable[_Union[RepeatBlock, _Mapping]]] = ...) -> None: ...

class RepeatBlock(_message.Message):
    __slots__ = ("id", "name", "first_node", "last_node", "instances")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FIRST_NODE_FIELD_NUMBER: _ClassVar[int]
    LAST_NODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    first_node: int
    last_node: int
    instances: _containers.RepeatedCompositeFieldContainer[RepeatInstance]
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., first_node: _Optional[int] = ..., last_node: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[RepeatInstance, _Mapping]]] = ...) -> None: ...

class RepeatInstance(_message.Message):
    __slots__ = ("id_offset", "time_offset_ns", "seq_offsets", "annotation_deltas", "deps")
    class SeqOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AnnotationDeltasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIME_OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    SEQ_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATION_DELTAS_FIELD_NUMBER: _ClassVar[int]
    DEPS_FIELD_NUMBER: _ClassVar[int]
    id_offset: int
    time_offset_ns: int
    seq_offsets: _containers.ScalarMap[str, int]
    annotation_deltas: _containers.ScalarMap[str, int]
    deps: _containers.RepeatedCompositeFieldContainer[InstanceDep]
    def __init__(self, id_offset: _Optional[int] = ..., time_offset_ns: _Optional[int] = ..., seq_offsets: _Optional[_Mapping[str, int]] = ..., annotation_deltas: _Optional[_Mapping[str, int]] = ..., deps: _Optional[_Iterable[_Union[InstanceDep, _Mapping]]] = ...) -> None: ...

class InstanceDep(_message.Message):
    __slots__ = ("node", "id", "kind")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    node: int
    id: int
    kind: DepKind
    def __init__(self, node: _Optional[int] = ..., id: _Optional[int] = ..., kind: _Optional[_Union[DepKind, str]] = ...) -> None: ...

class Dep(_message.Message):
    __slots__ = ("id", "kind")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: DepKind
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[_Union[DepKind, str]] = ...) -> None: ...

class ComputeInfo(_message.Message):
    __slots__ = ("op", "kernel_class", "shapes", "dtypes", "flops", "bytes")
    OP_FIELD_NUMBER: _ClassVar[int]
    KERNEL_CLASS_FIELD_NUMBER: _ClassVar[int]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    DTYPES_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    op: str
    kernel_class: KernelClass
    shapes: str
    dtypes: str
    flops: float
    bytes: int
    def __init__(self, op: _Optional[str] = ..., kernel_class: _Optional[_Union[KernelClass, str]] = ..., shapes: _Optional[str] = ..., dtypes: _Optional[str] = ..., flops: _Optional[float] = ..., bytes: _Optional[int] = ...) -> None: ...

class CollectiveInfo(_message.Message):
    __slots__ = ("type", "in_bytes", "out_bytes", "dtype", "group", "seq", "root", "algorithm")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    type: CollectiveType
    in_bytes: int
    out_bytes: int
    dtype: str
    group: str
    seq: int
    root: int
    algorithm: str
    def __init__(self, type: _Optional[_Union[CollectiveType, str]] = ..., in_bytes: _Optional[int] = ..., out_bytes: _Optional[int] = ..., dtype: _Optional[str] = ..., group: _Optional[str] = ..., seq: _Optional[int] = ..., root: _Optional[int] = ..., algorithm: _Optional[str] = ...) -> None: ...

class P2PInfo(_message.Message):
    __slots__ = ("group", "peer", "bytes", "tag", "seq")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    group: str
    peer: int
    bytes: int
    tag: int
    seq: int
    def __init__(self, group: _Optional[str] = ..., peer: _Optional[int] = ..., bytes: _Optional[int] = ..., tag: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class CpuOpInfo(_message.Message):
    __slots__ = ("op", "correlation", "shapes", "dtypes", "rf_id")
    OP_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    DTYPES_FIELD_NUMBER: _ClassVar[int]
    RF_ID_FIELD_NUMBER: _ClassVar[int]
    op: str
    correlation: int
    shapes: str
    dtypes: str
    rf_id: int
    def __init__(self, op: _Optional[str] = ..., correlation: _Optional[int] = ..., shapes: _Optional[str] = ..., dtypes: _Optional[str] = ..., rf_id: _Optional[int] = ...) -> None: ...

class MemcpyInfo(_message.Message):
    __slots__ = ("bytes", "direction")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    direction: str
    def __init__(self, bytes: _Optional[int] = ..., direction: _Optional[str] = ...) -> None: ...

class Annotations(_message.Message):
    __slots__ = ("phase", "layer", "microbatch", "stage", "step")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    phase: str
    layer: int
    microbatch: int
    stage: int
    step: int
    def __init__(self, phase: _Optional[str] = ..., layer: _Optional[int] = ..., microbatch: _Optional[int] = ..., stage: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "name", "kind", "stream", "start_ns", "duration_ns", "deps", "compute", "collective", "p2p", "cpu", "memcpy", "annotations", "attrs")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    DEPS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    P2P_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMCPY_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    kind: NodeKind
    stream: int
    start_ns: int
    duration_ns: int
    deps: _containers.RepeatedCompositeFieldContainer[Dep]
    compute: ComputeInfo
    collective: CollectiveInfo
    p2p: P2PInfo
    cpu: CpuOpInfo
    memcpy: MemcpyInfo
    annotations: Annotations
    attrs: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[NodeKind, str]] = ..., stream: _Optional[int] = ..., start_ns: _Optional[int] = ..., duration_ns: _Optional[int] = ..., deps: _Optional[_Iterable[_Union[Dep, _Mapping]]] = ..., compute: _Optional[_Union[ComputeInfo, _Mapping]] = ..., collective: _Optional[_Union[CollectiveInfo, _Mapping]] = ..., p2p: _Optional[_Union[P2PInfo, _Mapping]] = ..., cpu: _Optional[_Union[CpuOpInfo, _Mapping]] = ..., memcpy: _Optional[_Union[MemcpyInfo, _Mapping]] = ..., annotations: _Optional[_Union[Annotations, _Mapping]] = ..., attrs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NodeList(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...
