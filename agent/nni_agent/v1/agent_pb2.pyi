from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrialState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRIAL_STATE_UNSPECIFIED: _ClassVar[TrialState]
    TRIAL_STATE_RUNNING: _ClassVar[TrialState]
    TRIAL_STATE_SUCCEEDED: _ClassVar[TrialState]
    TRIAL_STATE_FAILED: _ClassVar[TrialState]
    TRIAL_STATE_USER_CANCELED: _ClassVar[TrialState]
    TRIAL_STATE_EARLY_STOPPED: _ClassVar[TrialState]
    TRIAL_STATE_SYS_CANCELED: _ClassVar[TrialState]

class EndCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    END_CAUSE_UNSPECIFIED: _ClassVar[EndCause]
    END_CAUSE_EXITED: _ClassVar[EndCause]
    END_CAUSE_START_FAILED: _ClassVar[EndCause]
    END_CAUSE_CANCELLED: _ClassVar[EndCause]
    END_CAUSE_TIME_LIMIT: _ClassVar[EndCause]
    END_CAUSE_AGENT_SIGNALLED: _ClassVar[EndCause]
    END_CAUSE_AGENT_STOPPED: _ClassVar[EndCause]
    END_CAUSE_LOST: _ClassVar[EndCause]

class LogStream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOG_STREAM_UNSPECIFIED: _ClassVar[LogStream]
    LOG_STREAM_STDOUT: _ClassVar[LogStream]
    LOG_STREAM_STDERR: _ClassVar[LogStream]
    LOG_STREAM_TRIAL_LOG: _ClassVar[LogStream]

class FileError(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_ERROR_NONE: _ClassVar[FileError]
    FILE_ERROR_UNKNOWN_TRIAL: _ClassVar[FileError]
    FILE_ERROR_NOT_FOUND: _ClassVar[FileError]
    FILE_ERROR_NOT_ALLOWED: _ClassVar[FileError]
    FILE_ERROR_TOO_LARGE: _ClassVar[FileError]
    FILE_ERROR_IO: _ClassVar[FileError]
TRIAL_STATE_UNSPECIFIED: TrialState
TRIAL_STATE_RUNNING: TrialState
TRIAL_STATE_SUCCEEDED: TrialState
TRIAL_STATE_FAILED: TrialState
TRIAL_STATE_USER_CANCELED: TrialState
TRIAL_STATE_EARLY_STOPPED: TrialState
TRIAL_STATE_SYS_CANCELED: TrialState
END_CAUSE_UNSPECIFIED: EndCause
END_CAUSE_EXITED: EndCause
END_CAUSE_START_FAILED: EndCause
END_CAUSE_CANCELLED: EndCause
END_CAUSE_TIME_LIMIT: EndCause
END_CAUSE_AGENT_SIGNALLED: EndCause
END_CAUSE_AGENT_STOPPED: EndCause
END_CAUSE_LOST: EndCause
LOG_STREAM_UNSPECIFIED: LogStream
LOG_STREAM_STDOUT: LogStream
LOG_STREAM_STDERR: LogStream
LOG_STREAM_TRIAL_LOG: LogStream
FILE_ERROR_NONE: FileError
FILE_ERROR_UNKNOWN_TRIAL: FileError
FILE_ERROR_NOT_FOUND: FileError
FILE_ERROR_NOT_ALLOWED: FileError
FILE_ERROR_TOO_LARGE: FileError
FILE_ERROR_IO: FileError

class AgentMessage(_message.Message):
    __slots__ = ("hello", "records", "command_ack", "heartbeat", "gpus", "resources", "bundle_request", "file_chunk", "command_acked")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ACK_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    FILE_CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ACKED_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    records: RecordBatch
    command_ack: CommandAck
    heartbeat: Heartbeat
    gpus: GpuReport
    resources: ResourceReport
    bundle_request: BundleRequest
    file_chunk: FileChunk
    command_acked: int
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., records: _Optional[_Union[RecordBatch, _Mapping]] = ..., command_ack: _Optional[_Union[CommandAck, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., gpus: _Optional[_Union[GpuReport, _Mapping]] = ..., resources: _Optional[_Union[ResourceReport, _Mapping]] = ..., bundle_request: _Optional[_Union[BundleRequest, _Mapping]] = ..., file_chunk: _Optional[_Union[FileChunk, _Mapping]] = ..., command_acked: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("agent_id", "token", "agent_version", "protocol_major", "protocol_minor", "boot_id", "host", "trials", "gpus")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAJOR_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MINOR_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    token: str
    agent_version: str
    protocol_major: int
    protocol_minor: int
    boot_id: str
    host: HostInfo
    trials: _containers.RepeatedCompositeFieldContainer[TrialStatus]
    gpus: GpuReport
    def __init__(self, agent_id: _Optional[str] = ..., token: _Optional[str] = ..., agent_version: _Optional[str] = ..., protocol_major: _Optional[int] = ..., protocol_minor: _Optional[int] = ..., boot_id: _Optional[str] = ..., host: _Optional[_Union[HostInfo, _Mapping]] = ..., trials: _Optional[_Iterable[_Union[TrialStatus, _Mapping]]] = ..., gpus: _Optional[_Union[GpuReport, _Mapping]] = ...) -> None: ...

class HostInfo(_message.Message):
    __slots__ = ("hostname", "os", "python", "cpu_count", "memory_total", "work_dir", "pid")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WORK_DIR_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    os: str
    python: str
    cpu_count: int
    memory_total: int
    work_dir: str
    pid: int
    def __init__(self, hostname: _Optional[str] = ..., os: _Optional[str] = ..., python: _Optional[str] = ..., cpu_count: _Optional[int] = ..., memory_total: _Optional[int] = ..., work_dir: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class RecordBatch(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("seq", "status", "metric", "log", "parameter_request")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    seq: int
    status: TrialStatus
    metric: Metric
    log: LogChunk
    parameter_request: ParameterRequest
    def __init__(self, seq: _Optional[int] = ..., status: _Optional[_Union[TrialStatus, _Mapping]] = ..., metric: _Optional[_Union[Metric, _Mapping]] = ..., log: _Optional[_Union[LogChunk, _Mapping]] = ..., parameter_request: _Optional[_Union[ParameterRequest, _Mapping]] = ...) -> None: ...

class TrialStatus(_message.Message):
    __slots__ = ("trial_id", "state", "pid", "has_exit_code", "exit_code", "signal", "start_time_ms", "end_time_ms", "reason", "working_directory", "end_cause")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    START_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    END_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    END_CAUSE_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    state: TrialState
    pid: int
    has_exit_code: bool
    exit_code: int
    signal: int
    start_time_ms: int
    end_time_ms: int
    reason: str
    working_directory: str
    end_cause: EndCause
    def __init__(self, trial_id: _Optional[str] = ..., state: _Optional[_Union[TrialState, str]] = ..., pid: _Optional[int] = ..., has_exit_code: bool = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., start_time_ms: _Optional[int] = ..., end_time_ms: _Optional[int] = ..., reason: _Optional[str] = ..., working_directory: _Optional[str] = ..., end_cause: _Optional[_Union[EndCause, str]] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("trial_id", "trial_seq", "data", "time_ms")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    trial_seq: int
    data: str
    time_ms: int
    def __init__(self, trial_id: _Optional[str] = ..., trial_seq: _Optional[int] = ..., data: _Optional[str] = ..., time_ms: _Optional[int] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("trial_id", "stream", "offset", "data")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    stream: LogStream
    offset: int
    data: bytes
    def __init__(self, trial_id: _Optional[str] = ..., stream: _Optional[_Union[LogStream, str]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ParameterRequest(_message.Message):
    __slots__ = ("trial_id", "parameter_index")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_INDEX_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    parameter_index: int
    def __init__(self, trial_id: _Optional[str] = ..., parameter_index: _Optional[int] = ...) -> None: ...

class CommandAck(_message.Message):
    __slots__ = ("cmd_seq",)
    CMD_SEQ_FIELD_NUMBER: _ClassVar[int]
    cmd_seq: int
    def __init__(self, cmd_seq: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time_ms",)
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    time_ms: int
    def __init__(self, time_ms: _Optional[int] = ...) -> None: ...

class GpuReport(_message.Message):
    __slots__ = ("time_ms", "gpus", "unavailable_reason", "provider")
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    time_ms: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSample]
    unavailable_reason: str
    provider: str
    def __init__(self, time_ms: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., unavailable_reason: _Optional[str] = ..., provider: _Optional[str] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("index", "model", "uuid", "utilization", "memory_used", "memory_total", "processes", "active")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    index: int
    model: str
    uuid: str
    utilization: float
    memory_used: int
    memory_total: int
    processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    active: bool
    def __init__(self, index: _Optional[int] = ..., model: _Optional[str] = ..., uuid: _Optional[str] = ..., utilization: _Optional[float] = ..., memory_used: _Optional[int] = ..., memory_total: _Optional[int] = ..., processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., active: bool = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("pid", "used_memory", "type")
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    pid: int
    used_memory: int
    type: str
    def __init__(self, pid: _Optional[int] = ..., used_memory: _Optional[int] = ..., type: _Optional[str] = ...) -> None: ...

class ResourceReport(_message.Message):
    __slots__ = ("time_ms", "trials")
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    time_ms: int
    trials: _containers.RepeatedCompositeFieldContainer[TrialResources]
    def __init__(self, time_ms: _Optional[int] = ..., trials: _Optional[_Iterable[_Union[TrialResources, _Mapping]]] = ...) -> None: ...

class TrialResources(_message.Message):
    __slots__ = ("trial_id", "cpu_percent", "rss_bytes", "num_processes")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    cpu_percent: float
    rss_bytes: int
    num_processes: int
    def __init__(self, trial_id: _Optional[str] = ..., cpu_percent: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., num_processes: _Optional[int] = ...) -> None: ...

class BundleRequest(_message.Message):
    __slots__ = ("digest",)
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    digest: str
    def __init__(self, digest: _Optional[str] = ...) -> None: ...

class ManagerMessage(_message.Message):
    __slots__ = ("welcome", "command", "ack", "bundle_chunk", "file_request", "acked")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_CHUNK_FIELD_NUMBER: _ClassVar[int]
    FILE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    command: Command
    ack: Ack
    bundle_chunk: BundleChunk
    file_request: FileRequest
    acked: int
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., bundle_chunk: _Optional[_Union[BundleChunk, _Mapping]] = ..., file_request: _Optional[_Union[FileRequest, _Mapping]] = ..., acked: _Optional[int] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("manager_version", "protocol_major", "protocol_minor", "acked_seq", "experiment_id", "heartbeat_interval_ms", "gpu_sample_interval_ms", "session_token")
    MANAGER_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAJOR_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MINOR_FIELD_NUMBER: _ClassVar[int]
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_SAMPLE_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    manager_version: str
    protocol_major: int
    protocol_minor: int
    acked_seq: int
    experiment_id: str
    heartbeat_interval_ms: int
    gpu_sample_interval_ms: int
    session_token: str
    def __init__(self, manager_version: _Optional[str] = ..., protocol_major: _Optional[int] = ..., protocol_minor: _Optional[int] = ..., acked_seq: _Optional[int] = ..., experiment_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., gpu_sample_interval_ms: _Optional[int] = ..., session_token: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("cmd_seq", "start_trial", "send_parameter", "cancel_trial", "shutdown")
    CMD_SEQ_FIELD_NUMBER: _ClassVar[int]
    START_TRIAL_FIELD_NUMBER: _ClassVar[int]
    SEND_PARAMETER_FIELD_NUMBER: _ClassVar[int]
    CANCEL_TRIAL_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    cmd_seq: int
    start_trial: StartTrial
    send_parameter: SendParameter
    cancel_trial: CancelTrial
    shutdown: Shutdown
    def __init__(self, cmd_seq: _Optional[int] = ..., start_trial: _Optional[_Union[StartTrial, _Mapping]] = ..., send_parameter: _Optional[_Union[SendParameter, _Mapping]] = ..., cancel_trial: _Optional[_Union[CancelTrial, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_duration_ms", "kill_signal", "grace_period_ms")
    MAX_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    KILL_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    GRACE_PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    max_duration_ms: int
    kill_signal: int
    grace_period_ms: int
    def __init__(self, max_duration_ms: _Optional[int] = ..., kill_signal: _Optional[int] = ..., grace_period_ms: _Optional[int] = ...) -> None: ...

class Bundle(_message.Message):
    __slots__ = ("digest", "size")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size: int
    def __init__(self, digest: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class GpuAssignment(_message.Message):
    __slots__ = ("scheduled", "indices")
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    scheduled: bool
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, scheduled: bool = ..., indices: _Optional[_Iterable[int]] = ...) -> None: ...

class StartTrial(_message.Message):
    __slots__ = ("trial_id", "sequence_id", "experiment_id", "platform", "command", "working_directory", "code_directory", "bundle", "env", "parameter", "gpus", "limits", "output_directory")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    CODE_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    sequence_id: int
    experiment_id: str
    platform: str
    command: str
    working_directory: str
    code_directory: str
    bundle: Bundle
    env: _containers.ScalarMap[str, str]
    parameter: str
    gpus: GpuAssignment
    limits: Limits
    output_directory: str
    def __init__(self, trial_id: _Optional[str] = ..., sequence_id: _Optional[int] = ..., experiment_id: _Optional[str] = ..., platform: _Optional[str] = ..., command: _Optional[str] = ..., working_directory: _Optional[str] = ..., code_directory: _Optional[str] = ..., bundle: _Optional[_Union[Bundle, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., parameter: _Optional[str] = ..., gpus: _Optional[_Union[GpuAssignment, _Mapping]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., output_directory: _Optional[str] = ...) -> None: ...

class SendParameter(_message.Message):
    __slots__ = ("trial_id", "index", "parameter")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    index: int
    parameter: str
    def __init__(self, trial_id: _Optional[str] = ..., index: _Optional[int] = ..., parameter: _Optional[str] = ...) -> None: ...

class CancelTrial(_message.Message):
    __slots__ = ("trial_id", "early_stopped", "reason")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    early_stopped: bool
    reason: str
    def __init__(self, trial_id: _Optional[str] = ..., early_stopped: bool = ..., reason: _Optional[str] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class FileRequest(_message.Message):
    __slots__ = ("request_id", "trial_id", "experiment_id", "path", "recursive", "max_bytes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    trial_id: str
    experiment_id: str
    path: str
    recursive: bool
    max_bytes: int
    def __init__(self, request_id: _Optional[int] = ..., trial_id: _Optional[str] = ..., experiment_id: _Optional[str] = ..., path: _Optional[str] = ..., recursive: bool = ..., max_bytes: _Optional[int] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("request_id", "path", "offset", "data", "eof", "last", "error", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    path: str
    offset: int
    data: bytes
    eof: bool
    last: bool
    error: FileError
    message: str
    def __init__(self, request_id: _Optional[int] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., eof: bool = ..., last: bool = ..., error: _Optional[_Union[FileError, str]] = ..., message: _Optional[str] = ...) -> None: ...

class BundleChunk(_message.Message):
    __slots__ = ("digest", "offset", "data", "last", "error")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    digest: str
    offset: int
    data: bytes
    last: bool
    error: str
    def __init__(self, digest: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., last: bool = ..., error: _Optional[str] = ...) -> None: ...
