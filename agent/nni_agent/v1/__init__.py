"""Generated wire contract (proto/nni_agent/v1/agent.proto) plus its version numbers."""

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 3  # 1: Welcome.session_token (single-use enrolment credentials); 2: FileRequest / FileChunk;
# 3: TrialStatus.end_cause
