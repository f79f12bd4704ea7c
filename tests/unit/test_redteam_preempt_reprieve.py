"""Red team of the preempt verb: a reduced answer leaves the preemptor failing kube-scheduler's own filters.

kube-scheduler's dry run (DefaultPreemption, SelectVictimsOnNode) removes every lower-priority pod, then
puts them back most important first, keeping one out only when putting it back makes the preemptor fail its
filter plugins (the extender is not asked). Its resource filters are monotone in the pods present, so with
any one victim v left on the node the preemptor fails them: every victim is needed, for something kube-
scheduler counts (sgpu-memory, sgpu-core, cpu, memory, pods). kube-scheduler does not check the extender's
answer against its filters: it evicts what it is told and nominates the preemptor. An answer that keeps a
strict subset of the proposal (the former outcome `reduced`) therefore evicts pods after which the preemptor still
does not fit the node: it stays Pending ("Insufficient cpu" on its nominated node), and a second preemption
round evicts the rest there, or picks another node and the first victims went for nothing.

The model below is kube-scheduler's reprieve over node totals (cpu, sgpu-memory, sgpu-core), as
NodeResourcesFit counts them; the cards are the ledger's. The case is the table's own "victim on another card
dropped" made concrete: the victim on the other card was proposed for its cpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.domain.preempt import choose_victims
from tests.unit.test_preempt import node, sl

CPU = 64  # deploy/local/nodes.py: what a harness node offers
CARDS = 2


@dataclass(frozen=True)
class P:
    uid: str
    card: int
    memory: int
    cores: int
    cpu: int
    priority: int


def fits_totals(present: list[P], memory: int, cores: int, cpu: int) -> bool:
    """NodeResourcesFit for the preemptor on a node holding `present` (node totals, as kube-scheduler)."""
    return (sum(p.memory for p in present) + memory <= 96 * CARDS
            and sum(p.cores for p in present) + cores <= 16 * CARDS
            and sum(p.cpu for p in present) + cpu <= CPU)


def select_victims(pods: list[P], prio: int, memory: int, cores: int, cpu: int) -> list[P]:
    """kube-scheduler's SelectVictimsOnNode (no PDBs): remove the lower ones, reprieve most important first."""
    lower = [p for p in pods if p.priority < prio]
    present = [p for p in pods if p.priority >= prio]
    assert fits_totals(present, memory, cores, cpu), "no preemption helps on this node"
    victims = []
    for p in sorted(lower, key=lambda p: -p.priority):  # stable: the earlier created first among equals
        if fits_totals([*present, p], memory, cores, cpu):
            present.append(p)
        else:
            victims.append(p)
    return victims


def test_the_victims_answered_let_the_preemptor_pass_kube_schedulers_filters() -> None:
    pods = [P("top", 0, 96, 16, 1, 100_000),  # card 0: a pod above the preemptor
            P("c", 1, 32, 4, 60, 10),  # card 1: a small slice with most of the node's cpu
            P("d", 1, 64, 4, 1, 10)]
    want_memory, want_cores, want_cpu, prio = 64, 4, 4, 1000
    assert not fits_totals(pods, want_memory, want_cores, want_cpu)
    proposal = select_victims(pods, prio, want_memory, want_cores, want_cpu)
    assert [p.uid for p in proposal] == ["c", "d"]  # c for its cpu, d for its memory: both on card 1

    states, holdings = node([(p.uid, (p.card,), p.memory, p.cores, p.priority) for p in pods], cards=CARDS)
    choice = choose_victims(states, holdings, [p.uid for p in proposal], sl(want_memory), {})
    evicted = set(choice.victims)
    left = [p for p in pods if p.uid not in evicted]
    assert fits_totals(left, want_memory, want_cores, want_cpu), (
        f"answered {choice.outcome} {choice.victims} of {[p.uid for p in proposal]}: after they go the "
        f"preemptor still fails kube-scheduler's NodeResourcesFit (cpu {sum(p.cpu for p in left)} of {CPU} "
        f"used, it asks {want_cpu})")
