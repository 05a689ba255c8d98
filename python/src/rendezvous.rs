//! `coordstore._native.Rendezvous`: torchrun's native rendezvous (the agent
//! library's `rendezvous::Run`) for the handler in `coordstore.rendezvous`.

use std::path::PathBuf;
use std::time::Duration;

use agent::closures as cl;
use agent::rendezvous::{Agent, Error, Run, Settings};
use pyo3::prelude::*;

use super::{err, tls, wait};

/// One run (torchrun's `--rdzv-id`) on a cluster.
#[pyclass(module = "coordstore._native")]
pub struct Rendezvous {
    run: Run,
}

fn agent(addr: String, pid: u64, local_id: u64) -> Agent {
    Agent {
        addr,
        pid,
        local_id,
    }
}

fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

/// (round, complete, closed, place, waiting, participants): place 0 none,
/// 1 participant, 2 waiting, 3 redundant.
type ViewTuple = (u64, bool, bool, i32, u32, u32);

fn view_tuple(v: agent::rendezvous::View) -> ViewTuple {
    (
        v.round,
        v.complete,
        v.closed,
        v.place,
        v.waiting,
        v.participants,
    )
}

#[pymethods]
impl Rendezvous {
    #[new]
    #[pyo3(signature = (endpoints, run, *, namespace = None, tls_ca = None, tls_cert = None, tls_key = None))]
    fn new(
        endpoints: Vec<String>,
        run: String,
        namespace: Option<String>,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<Rendezvous> {
        let tls = tls(tls_ca, tls_cert, tls_key)?;
        let nodes = cl::Nodes {
            addrs: &endpoints,
            namespace: namespace.as_deref(),
            tls: &tls,
        };
        let _guard = super::runtime().enter();
        Ok(Rendezvous {
            run: Run::new(&nodes, &run).map_err(err)?,
        })
    }

    /// torch's next_rendezvous: ("formed", round, rank, world_size), or
    /// ("closed" | "graceful_exit" | "timeout", 0, 0, 0).
    #[pyo3(signature = (addr, pid, local_id, min_nodes, max_nodes, last_call_s, keep_alive_s, keep_alive_max_attempt, join_timeout_s, rejoin))]
    #[allow(clippy::too_many_arguments)]
    fn next_rendezvous(
        &self,
        py: Python<'_>,
        addr: String,
        pid: u64,
        local_id: u64,
        min_nodes: u32,
        max_nodes: u32,
        last_call_s: f64,
        keep_alive_s: f64,
        keep_alive_max_attempt: u32,
        join_timeout_s: f64,
        rejoin: bool,
    ) -> PyResult<(String, u64, u32, u32)> {
        let settings = Settings {
            min_nodes,
            max_nodes,
            last_call: seconds(last_call_s),
            keep_alive_every: seconds(keep_alive_s),
            keep_alive_max_attempt,
        };
        let me = agent(addr, pid, local_id);
        let run = self.run.clone();
        let fut = async move {
            run.next_rendezvous(&me, &settings, seconds(join_timeout_s), rejoin)
                .await
        };
        match wait(py, fut)? {
            Ok(f) => Ok(("formed".into(), f.round, f.rank, f.world_size)),
            Err(Error::Closed) => Ok(("closed".into(), 0, 0, 0)),
            Err(Error::GracefulExit) => Ok(("graceful_exit".into(), 0, 0, 0)),
            Err(Error::Timeout) => Ok(("timeout".into(), 0, 0, 0)),
            Err(Error::Status(s)) => Err(err(s)),
        }
    }

    /// What the agent reads of its run now (see `ViewTuple`).
    fn view(&self, py: Python<'_>, addr: String, pid: u64, local_id: u64) -> PyResult<ViewTuple> {
        let me = agent(addr, pid, local_id);
        let v = wait(py, self.run.watch(&me, 0, Duration::ZERO))?.map_err(err)?;
        Ok(view_tuple(v))
    }

    /// The agent is alive.
    fn keep_alive(&self, py: Python<'_>, addr: String, pid: u64, local_id: u64) -> PyResult<()> {
        let me = agent(addr, pid, local_id);
        wait(py, self.run.keep_alive(&me))?.map_err(err)
    }

    /// The agent leaves its round or list.
    fn leave(&self, py: Python<'_>, addr: String, pid: u64, local_id: u64) -> PyResult<ViewTuple> {
        let me = agent(addr, pid, local_id);
        let v = wait(py, self.run.leave(&me))?.map_err(err)?;
        Ok(view_tuple(v))
    }

    /// Closes the run for good.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        wait(py, self.run.close())?.map_err(err).map(|_| ())
    }
}
