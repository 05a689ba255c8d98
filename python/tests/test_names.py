"""coordstore.relay.namespace_name: the namespace torchrun's handler
derives from --rdzv-id is always a DNS label other than `default`, the id
itself where it is one, and two ids never share one."""

from __future__ import annotations

from coordstore.relay import is_namespace_name, namespace_name


def test_namespace_names_from_job_ids():
    assert namespace_name("job42") == "job42"
    assert namespace_name("a" * 63) == "a" * 63
    cases = ["Job_42", "job_42", "job-42-", "default", "none", "", "--", "x" * 64, "ünïcode run/7"]
    made = [namespace_name(c) for c in cases]
    assert all(is_namespace_name(n) for n in made), made
    assert len(set(made)) == len(made), made
    assert made[0].startswith("job-42-") and made[1].startswith("job-42-")
    assert namespace_name("default") != "default"
