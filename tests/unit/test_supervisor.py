"""The supervision state machine on values: event sequences in, decisions and verdicts out.

One test per fault kind the cluster tests exercise on real hosts (a rank's own exit code, a
signal, a lost host, a host that never joins, silence, a stall, ranks finishing apart, Ctrl-C,
SIGTERM, `fstrain stop`, a second stop, stragglers), for attached and detached runs alike."""

from __future__ import annotations

from fstrain.core.launch.supervisor import (
    COLLECT_STACKS,
    EXIT_LOST_HOST,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_STALLED,
    GAVE_UP,
    GIVE_UP,
    HANG_REPORT,
    KILL,
    LOST,
    TEARDOWN,
    AttemptEnd,
    Decision,
    Limits,
    Supervisor,
    describe_failure,
    stall_reason,
    stop_step,
)

NAMES = ("node1", "node2", "node3")


def attached(**limits: float) -> Supervisor:
    return Supervisor(NAMES, Limits(**limits), now_s=100.0)


def detached(**limits: float) -> Supervisor:
    return Supervisor(NAMES, Limits(**limits), now_s=100.0, joined=False)


def test_every_node_succeeds() -> None:
    run = attached()
    for node in range(3):
        assert run.node_exited(node, 0, 110.0 + node) == []
    assert run.ended
    assert run.verdict() == ("succeeded", 0, "")
    assert run.first_failure is None


def test_a_rank_exit_code_names_the_rank_and_tears_the_rest_down() -> None:
    run = attached()
    failure = {"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None}
    assert run.node_exited(1, 1, 105.0, failure) == [Decision(TEARDOWN, (0, 2))]
    assert (run.first_failure, run.exit_code) == (1, 7)  # the rank's own code, not its launcher's 1
    assert run.reason == "rank 3 (local rank 1) on node2 exited with 7"
    # the others end because of the teardown: consequences, not the cause
    assert run.node_exited(0, 143, 106.0) == []
    assert run.node_exited(2, 1, 106.5, {"rank": 5, "local_rank": 1, "exit_code": 1}) == []
    assert run.verdict() == ("failed", 7, "rank 3 (local rank 1) on node2 exited with 7")


def test_a_signal_names_the_signal() -> None:
    run = attached()
    run.node_exited(2, 1, 105.0, {"rank": 4, "local_rank": 0, "exit_code": 139, "signal": "SIGSEGV"})
    assert run.exit_code == 139
    assert run.reason == "rank 4 (local rank 0) on node3 was killed by SIGSEGV"


def test_without_a_known_rank_the_node_code_is_the_run_code() -> None:
    run = attached()
    run.node_exited(0, 2, 101.0)
    assert (run.state, run.exit_code, run.reason) == ("failed", 2, "the job on node1 exited with 2")


def test_no_exit_status_counts_as_a_lost_host() -> None:
    run = attached()
    assert run.node_exited(1, None, 101.0, error="connection lost before the job finished") == \
        [Decision(TEARDOWN, (0, 2))]
    assert (run.state, run.exit_code) == ("lost", EXIT_LOST_HOST)
    assert "node2" in run.reason and "connection lost" in run.reason


def test_a_lost_host_tears_down_and_is_the_first_failure() -> None:
    run = attached()
    assert run.node_lost(2, "no answer from the host for 30 s", 130.0) == [Decision(LOST, (2,)),
                                                                           Decision(TEARDOWN, (0, 1))]
    assert (run.state, run.exit_code, run.first_failure) == ("lost", EXIT_LOST_HOST, 2)
    assert run.reason == "node3 was lost: no answer from the host for 30 s"
    assert run.node_lost(2, "again", 131.0) == []  # once


def test_silence_past_the_heartbeat_timeout_is_a_lost_host() -> None:
    run = attached(heartbeat_timeout_s=30)
    run.heard(0, 120.0)
    run.heard(1, 125.0)
    run.heard(2, 101.0)
    assert run.tick(130.0) == []
    decisions = run.tick(131.5)
    assert decisions == [Decision(LOST, (2,)), Decision(TEARDOWN, (0, 1))]
    assert run.nodes[2].error == "no heartbeat for 30 s" and run.first_failure == 2


def test_the_heartbeat_rule_watches_only_the_nodes_that_answer() -> None:
    """Attached: a node over SSH has its link check (keepalives) and never answers heartbeats,
    so its silence (a rank computing quietly) is no loss; a node through srun answers each."""
    run = Supervisor(NAMES, Limits(heartbeat_timeout_s=30), now_s=100.0, heard_from=[False, True, False])
    assert run.tick(129.0) == []
    assert run.tick(131.0) == [Decision(LOST, (1,)), Decision(TEARDOWN, (0, 2))]
    assert run.reason == "node2 was lost: no heartbeat for 30 s"
    quiet = Supervisor(NAMES, Limits(heartbeat_timeout_s=30), now_s=100.0, heard_from=[False, True, False])
    quiet.heard(1, 490.0)
    assert quiet.tick(500.0) == [] and quiet.state == "running"  # the others: never lost for silence alone


def test_a_member_that_never_joins_is_lost_after_the_join_timeout() -> None:
    run = detached(join_timeout_s=120, heartbeat_timeout_s=30)
    assert run.state == "starting" and run.nodes[0].joined
    run.node_joined(1, 101.0)
    for now in (150.0, 222.0):
        run.heard(0, now)  # the coordinator's own node
        run.heard(1, now)
    assert run.tick(150.0) == []  # node3 not joined yet, no heartbeat rule for it
    assert run.tick(221.0) == []  # 120 s counts from node2's join (101), not from the start
    assert run.tick(222.0) == [Decision(LOST, (2,)), Decision(TEARDOWN, (0, 1))]
    assert run.reason == "node3 was lost: its watchdog did not connect within 120 s (and no other node did)"


def test_a_long_start_is_not_cut_short_while_nodes_keep_joining() -> None:
    names = [f"node{i}" for i in range(400)]
    run = Supervisor(names, Limits(join_timeout_s=120, heartbeat_timeout_s=30), now_s=0.0, joined=False)
    for index in range(1, 400):  # one node a second: the last joins 399 s after the start
        now = float(index)
        run.node_joined(index, now)
        for joined in range(index + 1):
            run.heard(joined, now)
        assert run.tick(now) == [], index
    assert run.state == "running"


def test_starting_becomes_running_once_every_member_joined() -> None:
    run = detached()
    run.node_joined(1, 101.0)
    assert run.state == "starting"
    run.node_joined(2, 102.0)
    assert run.state == "running"


def test_a_member_joining_a_stopping_run_is_stopped_at_once() -> None:
    run = detached(join_timeout_s=120)
    run.stop("term", "stopped", "stopped by `fstrain stop` (term)", EXIT_SIGTERM, 101.0)
    assert run.node_joined(2, 102.0) == [Decision(TEARDOWN, (2,))]


def test_no_output_for_the_stall_timeout_collects_stacks_then_stops_as_stalled() -> None:
    run = attached(stall_timeout_s=20)
    assert run.tick(200.0) == []  # nothing printed yet: start-up is not a stall
    run.output(110.0)
    assert run.tick(129.0) == []
    assert run.tick(130.0) == [Decision(COLLECT_STACKS, (0, 1, 2))]
    assert run.tick(131.0) == []  # asked once
    run.stacks_reported(0)
    run.stacks_reported(2)
    assert run.tick(135.0) == []  # node2 may still answer
    run.stacks_reported(1)
    assert run.tick(136.0) == [Decision(HANG_REPORT, ()), Decision(TEARDOWN, (0, 1, 2))]
    assert (run.state, run.exit_code, run.reason) == ("stalled", EXIT_STALLED,
                                                      "no rank printed anything for 20 s")
    for node in range(3):
        run.node_exited(node, 143, 140.0)
    assert run.verdict() == ("stalled", EXIT_STALLED, "no rank printed anything for 20 s")


def test_stacks_that_never_come_are_named_in_the_report() -> None:
    run = attached(stall_timeout_s=5, stacks_wait_s=30)
    run.output(100.0)
    assert run.tick(106.0)[0].action == COLLECT_STACKS
    run.stacks_reported(1)
    assert run.tick(135.0) == []
    assert run.tick(136.5)[0] == Decision(HANG_REPORT, (0, 2))


def test_ranks_finishing_apart_past_the_finish_timeout_is_a_stall() -> None:
    run = attached(finish_timeout_s=10)
    run.output(100.0)
    run.rank_finished(102.0)  # a rank of node1 exited 0 while its node runs on
    run.node_exited(1, 0, 104.0)
    assert run.tick(111.0) == []
    assert run.tick(112.0) == [Decision(COLLECT_STACKS, (0, 2))]
    assert run.stall_reason == "some ranks finished 10 s ago and others are still running"


def test_no_silence_is_a_stall_once_no_node_has_a_rank_left() -> None:
    """torchrun's agents wait in their exit barrier and close the rendezvous after their ranks
    ended: the silence then is no rank's; it is while any node still has a rank."""
    run = attached(stall_timeout_s=8)
    run.output(100.0)
    run.node_exited(0, 0, 101.0)
    run.rank_finished(101.5, 1, all_ended=True)
    run.rank_finished(102.0, 2, all_ended=False)  # one of node3's ranks ended, another runs on
    assert run.tick(108.5)[0] == Decision(COLLECT_STACKS, (1, 2))
    run = attached(stall_timeout_s=8)
    run.output(100.0)
    run.node_exited(0, 0, 101.0)
    run.rank_finished(101.5, 1, all_ended=True)
    run.rank_finished(102.0, 2, all_ended=True)
    assert run.tick(130.0) == [] and run.stall_reason == ""
    assert run.node_exited(1, 0, 131.0) == [] and run.node_exited(2, 0, 131.5) == []
    assert run.verdict() == ("succeeded", 0, "")


def test_a_failure_while_stacks_are_collected_wins_over_the_stall() -> None:
    run = attached(stall_timeout_s=5)
    run.output(100.0)
    run.tick(106.0)
    run.node_exited(1, 1, 107.0, {"rank": 1, "local_rank": 0, "exit_code": 9})
    assert run.tick(120.0) == []  # no hang report once the run is stopping for another reason
    assert (run.state, run.exit_code) == ("failed", 9)


def test_ctrl_c_then_a_second_ctrl_c_kills() -> None:
    run = attached()
    assert run.stop("term", "interrupted", "interrupted (SIGINT)", EXIT_SIGINT, 101.0) == \
        [Decision(TEARDOWN, (0, 1, 2))]
    run.node_exited(0, 130, 102.0)
    assert run.stop("term", "interrupted", "again", EXIT_SIGINT, 102.5) == []  # a second term: nothing new
    assert run.stop("kill", "interrupted", "again", EXIT_SIGINT, 103.0) == [Decision(KILL, (1, 2))]
    assert run.stop("kill", "interrupted", "again", EXIT_SIGINT, 103.5) == []
    assert (run.state, run.exit_code, run.reason) == ("interrupted", EXIT_SIGINT, "interrupted (SIGINT)")


def test_failures_after_a_stop_do_not_change_the_verdict() -> None:
    run = attached()
    run.stop("term", "terminated", "terminated (SIGTERM)", EXIT_SIGTERM, 101.0)
    assert run.node_exited(0, 1, 102.0, {"rank": 0, "local_rank": 0, "exit_code": 1}) == []
    assert run.node_lost(1, "no heartbeat", 103.0) == [Decision(LOST, (1,))]  # no longer waited for; no verdict
    run.node_exited(2, 143, 104.0)
    assert run.verdict() == ("terminated", EXIT_SIGTERM, "terminated (SIGTERM)")
    assert run.first_failure is None


def test_stop_force_kills_at_once_and_a_grace_changes_the_teardown() -> None:
    run = detached()
    assert run.stop("kill", "stopped", "stopped by `fstrain stop` (kill)", EXIT_SIGTERM, 101.0) == \
        [Decision(KILL, (0, 1, 2))]
    other = detached(grace_s=15)
    assert other.stop("term", "stopped", "stopped", EXIT_SIGTERM, 101.0, grace_s=2) == \
        [Decision(TEARDOWN, (0, 1, 2), grace_s=2)]


def test_nodes_that_do_not_stop_in_time_are_given_up() -> None:
    run = attached(grace_s=5, straggler_margin_s=10)
    run.node_exited(0, 3, 100.0)
    run.node_exited(1, 143, 101.0)
    assert run.tick(115.0) == []
    assert run.tick(115.5) == [Decision(GIVE_UP, (2,))]
    assert run.ended and run.nodes[2].error == GAVE_UP
    assert run.verdict() == ("failed", 3, "the job on node1 exited with 3")


def test_the_verdict_while_running_and_after() -> None:
    run = detached()
    assert run.verdict() == ("starting", 0, "")
    run.node_joined(1, 101.0)
    run.node_joined(2, 101.0)
    run.node_exited(0, 0, 110.0)
    assert run.verdict() == ("running", 0, "")


def test_stall_reason_on_one_clock() -> None:
    assert stall_reason(100.0, None, None, 10, 10) == ""
    assert stall_reason(100.0, 90.0, None, 10, None) == "no rank printed anything for 10 s"
    assert stall_reason(100.0, 90.5, None, 10, None) == ""
    assert stall_reason(100.0, 99.0, 80.0, 10, 20).startswith("some ranks finished 20 s ago")
    assert stall_reason(100.0, 99.0, 75.0, None, 30) == ""
    assert stall_reason(100.0, 0.0, None, None, None) == ""


def test_describe_failure_names_what_is_known() -> None:
    assert describe_failure("n", 1, None) == "the job on n exited with 1"
    assert describe_failure("n", 1, {"local_rank": 2, "exit_code": 7}) == "local rank 2 on n exited with 7"
    assert describe_failure("n", 1, {"rank": 9, "exit_code": 7}) == "rank 9 on n exited with 7"


def test_a_followed_attempt_ends_once_final_and_node_0_read_or_long_out_of_reach() -> None:
    end = AttemptEnd(unreachable_s=30)
    assert not end.ended(final=False, watchdogs_alive=False, node0_read=True, now_s=100.0)
    assert not end.ended(final=True, watchdogs_alive=True, node0_read=True, now_s=101.0)  # a watchdog still ends
    assert end.ended(final=True, watchdogs_alive=False, node0_read=True, now_s=102.0)
    away = AttemptEnd(unreachable_s=30)
    assert not away.ended(True, False, False, 100.0)
    assert not away.ended(True, False, False, 129.0)
    assert not away.ended(False, False, False, 131.0)  # back in reach (not final yet): the clock starts again
    assert not away.ended(True, False, False, 140.0)
    assert away.ended(True, False, False, 170.5)


def test_a_scheduler_stop_kills_after_the_grace_period_then_gives_up() -> None:
    assert stop_step(10.0, grace_s=15.0, wait_s=60.0, killed=False) == ""
    assert stop_step(15.5, grace_s=15.0, wait_s=60.0, killed=False) == KILL
    assert stop_step(40.0, grace_s=15.0, wait_s=60.0, killed=True) == ""
    assert stop_step(75.5, grace_s=15.0, wait_s=60.0, killed=True) == GIVE_UP
    assert stop_step(80.0, grace_s=15.0, wait_s=60.0, killed=False) == KILL  # never given up unkilled
