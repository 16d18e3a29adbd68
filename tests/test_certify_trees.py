"""The exactness certificate's tree cases, reduced to 10^5 sequences per case
(scripts/certify.py draws 10^6 over every case): each tree verifier x proposal shape passes
its G-test against exact enumeration, and both planted tree bugs are rejected."""

from specsamp.experiments import certify


def test_quick_tree_certificate_passes_and_rejects_the_planted_tree_bugs():
  cases = [c for c in certify.all_cases("quick") if c.tree is not None]
  assert {(c.verifier, c.tree) for c in cases if c.bug is None} == {
    (v, t) for v in certify.TREE_VERIFIERS for t in certify.TREES
  }
  assert {c.warping for c in cases if c.bug is None} == set(certify.TREE_WARPINGS)
  assert {c.bug for c in cases} == {None, *certify.TREE_BUGS}
  results = certify.certify(cases, 100_000, level=1e-4, log=lambda line: None)
  failed = [(r.case.name, r.G, r.threshold) for r in results if not r.passed]
  assert not failed, failed
