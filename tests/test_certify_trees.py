"""The exactness certificate's tree cases, reduced to 10^5 sequences per trigram case (2 * 10^4
on the transformer, conftest.CERTIFY_DRAWS) and one case per shape (scripts/certify.py
--scope=trees draws 10^6 over every verifier x shape x warping x batch): each passes its G-test
against exact enumeration, and the planted drafting bug is rejected."""

import pytest
from conftest import quick_certificate
from test_certify import suite_cases

from specsamp.experiments.proofs import certify

# As test_certify.py's suite cases: a real case per tree verifier, and the planted drafting bug
# (rejected at 3.5x its threshold); a dynamic tree's greedy choice verified with the warped q
# (rejected at 300x, as its chain case) is the extended command's.
SUITE_REAL_CASES = (
  "trigram tree=tree:2,2,1 traversal model fixed T=0.7,p=0.9 batch=1 mesh=1",
  "trigram tree=tree:3,1,1/iid token model fixed top-k=3 batch=1 mesh=1",
)


@pytest.mark.slow
def test_the_planted_tree_drafting_bug_is_rejected_and_a_case_per_tree_verifier_passes():
  cases = [c for c in certify.all_cases("quick") if c.tree is not None]
  assert {c.bug for c in cases} == {None, "siblings_full_q", "chosen_real_q"}
  cases = suite_cases(cases, SUITE_REAL_CASES, ("siblings_full_q",))
  results = quick_certificate(cases)
  failed = [(r.case.name, r.G, r.threshold) for r in results if not r.passed]
  assert not failed, failed


@pytest.mark.slow
@pytest.mark.extended
def test_quick_tree_certificate_passes_and_rejects_the_planted_tree_bugs():
  cases = [c for c in certify.all_cases("quick") if c.tree is not None]
  real = [c for c in cases if c.bug is None]
  assert {c.tree for c in real} == {*certify.TREES, certify.DYNAMIC_TREE}
  assert {c.verifier for c in real} == set(certify.TREE_VERIFIERS)
  assert {c.warping for c in real} >= set(certify.TREE_WARPINGS)
  # The feature head's tree (sampled, real q) and greedy proposals (one-hot q) in a tree.
  assert {"feature", "model_greedy"} <= {c.drafter for c in real}
  # The verifier's sibling bug is rejected by exact enumeration (test_tree_verification.py);
  # a dynamic tree's chosen tokens verified with the draft's warped q must be rejected here.
  assert {c.bug for c in cases} == {None, "siblings_full_q", "chosen_real_q"}
  results = quick_certificate(cases)
  failed = [(r.case.name, r.G, r.threshold) for r in results if not r.passed]
  assert not failed, failed
