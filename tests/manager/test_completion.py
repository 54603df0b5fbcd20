"""The `Completion` rules (backends/base.py) as `service.trials.decide` applies them: when a trial
that runs on several agents ends, and how, from its members' latest statuses."""
from __future__ import annotations

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.backends.base import Completion
from nni_manager.service.trials import Member, decide
from nni_manager.types import TrialJobStatus as S

RUN, OK, FAIL = pb.TRIAL_STATE_RUNNING, pb.TRIAL_STATE_SUCCEEDED, pb.TRIAL_STATE_FAILED
CHIEF, W0, W1, PS0 = Member("a", "chief", 0), Member("b", "worker", 0), Member("c", "worker", 1), Member("d", "ps", 0)


def st(state: int, reason: str = "") -> pb.TrialStatus:
    return pb.TrialStatus(state=state, reason=reason)


def test_default_rule_ends_when_every_member_has_and_one_failure_fails_it() -> None:
    rule = Completion()
    assert decide(rule, [(W0, st(OK)), (W1, st(RUN))]) is None
    assert decide(rule, [(W0, st(OK)), (W1, None)]) is None  # a member not heard from yet
    assert decide(rule, [(W0, st(OK)), (W1, st(OK))]) == (S.SUCCEEDED, "")
    assert decide(rule, [(W0, st(RUN)), (W1, st(FAIL, "exit code 3"))]) == (S.FAILED, "worker-1: exit code 3")


def test_a_stopped_member_stops_the_whole_trial_before_any_other_rule() -> None:
    rule = Completion(decisive=("chief", 0))
    got = decide(rule, [(CHIEF, st(OK)), (W0, st(pb.TRIAL_STATE_SYS_CANCELED, "node lost"))])
    assert got == (S.SYS_CANCELED, "worker-0: node lost")
    assert decide(Completion(), [(W0, st(pb.TRIAL_STATE_USER_CANCELED)), (W1, st(RUN))]) == \
        (S.USER_CANCELED, "worker-0 ended")


def test_decisive_member_ends_the_trial_with_its_outcome() -> None:
    rule = Completion(decisive=("chief", 0))  # TFJob's chief
    members = [(CHIEF, st(RUN)), (W0, st(OK)), (PS0, st(RUN))]
    assert decide(rule, members) is None
    assert decide(rule, [(CHIEF, st(OK)), (W0, st(RUN)), (PS0, st(RUN))]) == (S.SUCCEEDED, "")
    assert decide(rule, [(CHIEF, st(FAIL, "OOM")), (W0, st(OK)), (PS0, st(RUN))]) == (S.FAILED, "chief-0: OOM")


def test_min_failed_per_role_and_never() -> None:
    two = Completion(min_failed={"worker": 2})
    assert decide(two, [(W0, st(FAIL, "x")), (W1, st(RUN)), (PS0, st(RUN))]) is None
    assert decide(two, [(W0, st(FAIL, "x")), (W1, st(FAIL, "y")), (PS0, st(RUN))]) == (S.FAILED, "worker-0: x")
    never = Completion(min_failed={"ps": -1})  # a parameter server's failure alone decides nothing
    assert decide(never, [(PS0, st(FAIL, "gone")), (W0, st(RUN))]) is None
    # every member ended: SUCCEEDED, as no failure counted (FrameworkController's rule)
    assert decide(never, [(PS0, st(FAIL, "gone")), (W0, st(OK))]) == (S.SUCCEEDED, "")


def test_min_succeeded_per_role_ends_the_trial_early() -> None:
    rule = Completion(min_succeeded={"worker": 1})  # PyTorch elastic style: one worker done is enough
    assert decide(rule, [(W0, st(OK)), (W1, st(RUN)), (PS0, st(RUN))]) == (S.SUCCEEDED, "")
    assert decide(Completion(), [(W0, st(OK)), (W1, st(RUN)), (PS0, st(RUN))]) is None  # default: never early


def test_failure_rule_is_checked_before_success_rule() -> None:
    rule = Completion(min_succeeded={"worker": 1})
    assert decide(rule, [(W0, st(OK)), (PS0, st(FAIL, "bad"))]) == (S.FAILED, "ps-0: bad")
