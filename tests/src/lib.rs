//! coordstore-tests: tests at the edges — real `coordstore` processes on
//! loopback, SIGKILL fault injection, stock jaxlib and TensorFlow clients.
//! Shared helpers live here; the tests are in `tests/`.
