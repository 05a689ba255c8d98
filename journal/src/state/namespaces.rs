//! The namespace lifecycle in the state: a create checked (also before it
//! is proposed) and applied, a delete.

use super::*;

impl State {
    /// Checks `CreateNamespace` `c` against this state without applying it:
    /// the namespace's data as the create would insert it (its spec's
    /// creation time `at_ms`), or why it is refused. The leader runs it
    /// before proposing, so a refused create proposes nothing; the apply
    /// runs it again.
    pub fn check_create(
        &self,
        c: &CreateNamespace,
        at_ms: u64,
    ) -> Result<NamespaceData, DomainError> {
        let name = c.name.as_str();
        if !namespace::valid_name(name) {
            return Err(namespace::bad_name(name));
        }
        if name == namespace::DEFAULT_NAMESPACE || self.data.namespaces.contains_key(name) {
            return Err(namespace::exists(name));
        }
        let count = 1 + self.data.namespaces.len() as u64;
        if c.max_namespaces > 0 && count >= c.max_namespaces {
            return Err(namespace::too_many(c.max_namespaces));
        }
        let mut data = c.data.clone().unwrap_or_default();
        let config = match &c.data {
            Some(d) => d.config.clone().unwrap_or_default(),
            None => c.config.clone().unwrap_or_default(),
        };
        check_config(&config)?;
        if total_tasks(&config) == 0 {
            return Err(namespace::no_tasks(name));
        }
        let mut spec = c.spec.clone().unwrap_or_default();
        if let Some(imported) = &data.spec {
            // An import keeps what it had but the port (the cluster's).
            let port = spec.port;
            spec = NamespaceSpec {
                port,
                ..imported.clone()
            };
        }
        if c.port_low > 0 && !(c.port_low..=c.port_high).contains(&spec.port) {
            return Err(namespace::port_outside(spec.port, c.port_low, c.port_high));
        }
        // Port 0: no port of its own (reached by name on the main port).
        if let Some(other) = self
            .data
            .namespaces
            .iter()
            .filter(|_| spec.port != 0)
            .find(|(_, n)| n.spec.as_ref().is_some_and(|s| s.port == spec.port))
        {
            return Err(namespace::port_taken(spec.port, other.0));
        }
        spec.created_ms = at_ms;
        data.initialized = true;
        data.config = Some(config);
        data.spec = Some(spec);
        data.last_active_ms = at_ms;
        if c.data.is_none() {
            data.service_incarnation = c.service_incarnation;
            data.epoch = 0;
        }
        data.coordination.get_or_insert_with(Default::default);
        data.dispatcher.get_or_insert_with(Default::default);
        data.closures.get_or_insert_with(Default::default);
        check_namespace(name, &data).map_err(errors::bad_config)?;
        Ok(data)
    }

    pub(super) fn create_namespace(
        &mut self,
        c: &CreateNamespace,
        at_ms: u64,
        mut touched: Option<&mut Touched>,
    ) -> Outcome {
        let data = match self.check_create(c, at_ms) {
            Ok(d) => d,
            Err(e) => return Outcome::err(e),
        };
        let name = c.name.as_str();
        let bytes = data.coordination.as_ref().map_or(0, coordination::kv_bytes);
        self.kv_bytes.insert(name.to_string(), bytes);
        self.data.namespaces.insert(name.to_string(), data);
        if c.data.is_none() {
            self.init_areas(name, at_ms);
        }
        touch_namespace(&mut touched, name);
        if let Some(t) = touched {
            t.namespace_set = true;
        }
        Outcome::with_service_incarnation(self.epoch_incarnation(name))
    }

    pub(super) fn delete_namespace(
        &mut self,
        c: &DeleteNamespace,
        mut touched: Option<&mut Touched>,
    ) -> Outcome {
        let key = namespace_key(&c.name);
        if key.is_empty() {
            return Outcome::err(namespace::default_kept());
        }
        self.kv_bytes.remove(key);
        if self.data.namespaces.remove(key).is_none() {
            return Outcome::err(namespace::unknown(key));
        }
        touch_namespace(&mut touched, key);
        if let Some(t) = touched {
            t.namespace_set = true;
        }
        Outcome::ok()
    }
}

/// A namespace other than the default one: a valid name, configured, with
/// a valid configuration and every area's part.
pub(super) fn check_namespace(name: &str, n: &NamespaceData) -> Result<(), String> {
    if !namespace::valid_name(name) || name == namespace::DEFAULT_NAMESPACE {
        return Err(format!("namespace {name:?}: not a valid namespace name"));
    }
    if !n.initialized || n.config.is_none() || n.spec.is_none() {
        return Err(format!("namespace {name}: not configured"));
    }
    if let Some(c) = &n.config {
        check_config(c).map_err(|e| format!("namespace {name}: {}", e.message))?;
    }
    if n.coordination.is_none() || n.dispatcher.is_none() || n.closures.is_none() {
        return Err(format!("namespace {name}: an area's part is missing"));
    }
    if let Some(t) = &n.torch {
        crate::torch::check_data(t).map_err(|e| format!("namespace {name}: {e}"))?;
    }
    if let Some(r) = &n.rendezvous {
        crate::rendezvous::check_data(r).map_err(|e| format!("namespace {name}: {e}"))?;
    }
    Ok(())
}
