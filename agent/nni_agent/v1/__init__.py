"""Generated wire contract (proto/nni_agent/v1/agent.proto) plus its version numbers."""

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 4  # 1: Welcome.session_token (single-use enrolment credentials); 2: FileRequest / FileChunk;
# 3: TrialStatus.end_cause; 4: acks riding on other messages (AgentMessage.command_acked, ManagerMessage.acked)
