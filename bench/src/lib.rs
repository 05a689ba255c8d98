//! coordstore-bench: the benchmark harness. Every suite runs coordstore and its
//! peers (etcd, jaxlib's built-in service) side by side in one run so results
//! are ratios that hold on a noisy machine. Filled by the benchmark issue.
