"""Tools for checking specsamp's samplers: ``exactness`` (exact enumeration, the G-test,
planted bugs), used by the certificate, the peer comparisons and the test suite."""
