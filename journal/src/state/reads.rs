//! Reading the state: every namespace as a [`Namespace`] view, a
//! namespace's whole data (an export) or its part of a snapshot, and the
//! default namespace's façade (the state as it read before namespaces).

use super::*;

impl State {
    /// Bytes of KV keys and values in namespace `key`.
    pub(super) fn bytes(&self, key: &str) -> u64 {
        if key.is_empty() {
            return self.default_kv_bytes;
        }
        self.kv_bytes.get(key).copied().unwrap_or(0)
    }

    /// The default namespace.
    pub fn default_namespace(&self) -> Namespace<'_> {
        let d = &self.data;
        Namespace {
            key: "",
            initialized: d.initialized,
            config: d.config.as_ref(),
            service_incarnation: d.service_incarnation,
            epoch: d.epoch,
            spec: None,
            last_active_ms: 0,
            kv_bytes: self.bytes(""),
            // Present from `State::default` and `decode_snapshot` on, the
            // only ways a state is made.
            coordination: d
                .coordination
                .as_ref()
                .expect("every area's part is present"),
            dispatcher: d.dispatcher.as_ref().expect("every area's part is present"),
            closures: d.closures.as_ref().expect("every area's part is present"),
            torch: d.torch.as_ref(),
            rendezvous: d.rendezvous.as_ref(),
        }
    }

    /// Namespace `name` ("" or `default`: the default one), if it exists.
    pub fn namespace(&self, name: &str) -> Option<Namespace<'_>> {
        let key = namespace_key(name);
        if key.is_empty() {
            return Some(self.default_namespace());
        }
        let (key, n) = self.data.namespaces.get_key_value(key)?;
        Some(namespace_of(key, n, self.bytes(key)))
    }

    /// Every namespace, the default one first, then by name.
    pub fn namespaces(&self) -> impl Iterator<Item = Namespace<'_>> + '_ {
        std::iter::once(self.default_namespace()).chain(
            self.data
                .namespaces
                .iter()
                .map(|(key, n)| namespace_of(key, n, self.bytes(key))),
        )
    }

    /// How many namespaces there are, the default one included.
    pub fn namespace_count(&self) -> usize {
        1 + self.data.namespaces.len()
    }

    /// A namespace's whole state as `NamespaceData` (what an export holds);
    /// `None` if it does not exist.
    pub fn namespace_data(&self, name: &str) -> Option<NamespaceData> {
        let key = namespace_key(name);
        if key.is_empty() {
            let d = &self.data;
            return Some(NamespaceData {
                initialized: d.initialized,
                config: d.config.clone(),
                service_incarnation: d.service_incarnation,
                epoch: d.epoch,
                spec: None,
                last_active_ms: 0,
                coordination: d.coordination.clone(),
                dispatcher: d.dispatcher.clone(),
                closures: d.closures.clone(),
                torch: d.torch.clone(),
                rendezvous: d.rendezvous.clone(),
            });
        }
        self.data.namespaces.get(key).cloned()
    }

    /// Namespace `name`'s own parts as a snapshot of a state that holds
    /// only it (no other namespace, no client sessions): what a client
    /// admitted to one namespace may read of the state, decoded with
    /// [`State::decode_snapshot`]. `None` if it does not exist.
    pub fn namespace_snapshot(&self, name: &str) -> Option<Vec<u8>> {
        let key = namespace_key(name);
        let n = self.namespace_data(name)?;
        let mut data = StateData {
            clock_ms: self.data.clock_ms,
            next_call_id: self.data.next_call_id,
            ..State::default().data
        };
        if key.is_empty() {
            data.initialized = n.initialized;
            data.config = n.config;
            data.service_incarnation = n.service_incarnation;
            data.epoch = n.epoch;
            data.coordination = n.coordination;
            data.dispatcher = n.dispatcher;
            data.closures = n.closures;
            data.torch = n.torch;
            data.rendezvous = n.rendezvous;
        } else {
            data.namespaces.insert(key.to_string(), n);
        }
        Some(data.encode_to_vec())
    }

    /// The default namespace's shared part: configuration, service
    /// incarnation, job epoch.
    pub fn cluster(&self) -> Cluster<'_> {
        self.default_namespace().cluster()
    }

    /// The default namespace's coordination area, read-only.
    pub fn coordination(&self) -> coordination::Reader<'_> {
        self.default_namespace().coordination()
    }

    /// The default namespace's tf.data dispatcher area, read-only.
    pub fn dispatcher(&self) -> dispatcher::Reader<'_> {
        self.default_namespace().dispatcher()
    }

    /// The default namespace's closure-queue area, read-only.
    pub fn closures(&self) -> closures::Reader<'_> {
        self.default_namespace().closures()
    }

    /// Whether an `InitService` has been applied.
    pub fn is_initialized(&self) -> bool {
        self.data.initialized
    }

    /// The default namespace's service incarnation (0 before initialisation).
    pub fn service_incarnation(&self) -> u64 {
        self.data.service_incarnation
    }

    /// The default namespace's job epoch, bumped by every `ResetJobEpoch`.
    pub fn epoch(&self) -> u64 {
        self.data.epoch
    }

    /// Number of updates applied (including retried ones).
    pub fn applied_count(&self) -> u64 {
        self.data.applied
    }

    /// The default namespace's configuration, if initialised (it also holds
    /// the cluster-wide bounds of the exactly-once table).
    pub fn config(&self) -> Option<&ClusterConfig> {
        self.data.config.as_ref()
    }

    /// Number of tasks in the default namespace's configuration.
    pub fn task_count(&self) -> u32 {
        self.cluster().task_count()
    }

    /// Dense index of task `id` of job `job` (default namespace).
    pub fn task_index(&self, job: &str, id: i32) -> Option<u32> {
        self.cluster().task_index(job, id)
    }

    /// (job, task id) of a dense index (default namespace).
    pub fn task_id(&self, index: u32) -> Option<(&str, i32)> {
        self.cluster().task_id(index)
    }

    /// The TensorFlow-style name of a task: `/job:NAME/replica:0/task:ID`.
    pub fn task_name(&self, index: u32) -> String {
        self.cluster().task_name(index)
    }

    /// How messages name a task (see [`Cluster::label`]).
    pub fn label(&self, index: u32) -> String {
        self.cluster().label(index)
    }
}

/// The view of namespace `key` stored as `n`.
pub(super) fn namespace_of<'a>(key: &'a str, n: &'a NamespaceData, kv_bytes: u64) -> Namespace<'a> {
    Namespace {
        key,
        kv_bytes,
        initialized: n.initialized,
        config: n.config.as_ref(),
        service_incarnation: n.service_incarnation,
        epoch: n.epoch,
        spec: n.spec.as_ref(),
        last_active_ms: n.last_active_ms,
        coordination: n
            .coordination
            .as_ref()
            .expect("every area's part is present"),
        dispatcher: n.dispatcher.as_ref().expect("every area's part is present"),
        closures: n.closures.as_ref().expect("every area's part is present"),
        torch: n.torch.as_ref(),
        rendezvous: n.rendezvous.as_ref(),
    }
}
