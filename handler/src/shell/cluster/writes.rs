//! [`FencingWrites`] over `kube`: the guarded Node patches, the legacy
//! deletions named by uid, the Events.

use super::*;
#[async_trait]
impl FencingWrites for Kube {
    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError> {
        let judged = JudgedNode {
            name: node,
            uid: stamp.node_uid.as_deref(),
            machine: &stamp.instance,
            version: None,
        };
        self.guarded_patch(
            node,
            TaintOutcome::NodeGone,
            // A taint whose answer was lost shows as this run's own.
            |current, _| match kube_patch::taint_patch(current, stamp) {
                _ if !judged.is_same_object(self.facts(current.clone()).as_ref()) => {
                    Write::Answer(TaintOutcome::AnotherNode)
                }
                TaintPatch::AnotherNode => Write::Answer(TaintOutcome::AnotherNode),
                TaintPatch::Apply(patch) => Write::Patch(patch, TaintOutcome::Applied),
                TaintPatch::AlreadyPresent => Write::Answer(TaintOutcome::AlreadyPresent),
                TaintPatch::AppliedByThisRun => Write::Answer(TaintOutcome::Applied),
                TaintPatch::NodeReady => Write::Answer(TaintOutcome::NodeReady),
                TaintPatch::NoResourceVersion | TaintPatch::Unrepresentable => Write::Refuse,
            },
        )
        .await
    }

    async fn node_event(
        &self,
        node: &str,
        event: &NodeEvent,
        name: &str,
    ) -> Result<(), ClusterError> {
        // The API and namespace the server takes; when its version cannot be
        // read, the current ones (the Event is then all that may be lost).
        let (events_api, namespace) = self
            .server_version()
            .await
            .map_or((EventsApi::V1, "default"), compat::node_events);
        let ev = event_object(node, event, name, namespace, &self.instance);
        // The name is fixed by the occasion, so a repeat after a lost answer
        // (or a retried invocation) meets AlreadyExists: recorded once.
        let params = PostParams::default();
        let created = match events_api {
            EventsApi::V1 => {
                let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
                retrying("create event", || api.create(&params, &ev))
                    .await
                    .map(drop)
            }
            EventsApi::V1beta1 => {
                let resource = ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("events.k8s.io", "v1beta1", "Event"),
                    "events",
                );
                let api: Api<DynamicObject> =
                    Api::namespaced_with(self.client.clone(), namespace, &resource);
                let obj = versioned(&ev, events_api).map_err(|e| ClusterError::CreateEvent {
                    node: node.into(),
                    source: kube::Error::SerdeError(e),
                })?;
                retrying("create event", || api.create(&params, &obj))
                    .await
                    .map(drop)
            }
        };
        match created {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
            Err(source) => Err(ClusterError::CreateEvent {
                node: node.into(),
                source,
            }),
        }
    }

    async fn mark_not_ready(
        &self,
        judged: &JudgedNode<'_>,
        message: &str,
    ) -> Result<MarkOutcome, ClusterError> {
        let node = judged.name;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let current = match retrying("get node", || nodes.get_opt(node)).await {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(MarkOutcome::NodeGone),
            Err(source) => {
                return Err(ClusterError::GetNode {
                    node: node.into(),
                    source,
                });
            }
        };
        let facts = self.facts(current.clone());
        if !judged.is(facts.as_ref()) {
            return Ok(MarkOutcome::AnotherNode);
        }
        if !judged.unchanged(facts.as_ref()) {
            return Ok(MarkOutcome::Conflict);
        }
        let Some(patch) = mark_patch_now(node, &current, message)? else {
            return Ok(MarkOutcome::AlreadyNotReady);
        };
        let params = PatchParams::default();
        let strategic = Patch::Strategic(&patch);
        match retrying("patch node status", || {
            nodes.patch_status(node, &params, &strategic)
        })
        .await
        {
            Ok(_) => Ok(MarkOutcome::Marked),
            Err(e) if is_conflict(&e) => Ok(MarkOutcome::Conflict),
            Err(e) if is_not_found(&e) => Ok(MarkOutcome::NodeGone),
            Err(source) => Err(ClusterError::PatchNodeStatus {
                node: node.into(),
                source,
            }),
        }
    }

    async fn untaint_node(
        &self,
        node: &str,
        ending: &Ending<'_>,
    ) -> Result<UntaintOutcome, ClusterError> {
        self.guarded_patch(node, UntaintOutcome::NodeGone, |current, sent| {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            match kube_patch::untaint_patch(current, ending, now) {
                UntaintPatch::Apply {
                    patch,
                    removes_taint,
                } => Write::Patch(
                    patch,
                    UntaintOutcome::Ended {
                        taint_removed: removes_taint,
                    },
                ),
                // Also what our own patch looks like once its answer was
                // lost: then it is what that patch did.
                UntaintPatch::NotOurs => Write::Answer(sent.unwrap_or(UntaintOutcome::NotOurs)),
                UntaintPatch::NodeNotReady => Write::Answer(UntaintOutcome::NodeNotReady),
                UntaintPatch::NotSettled { remaining_secs } => {
                    Write::Answer(UntaintOutcome::NotSettled { remaining_secs })
                }
                UntaintPatch::NotConfirmed => Write::Answer(UntaintOutcome::NotConfirmed),
                UntaintPatch::NoResourceVersion | UntaintPatch::Unrepresentable => Write::Refuse,
            }
        })
        .await
    }

    async fn confirm_recovery(
        &self,
        node: &str,
        fenced_at: Option<&str>,
    ) -> Result<ConfirmOutcome, ClusterError> {
        self.guarded_patch(node, ConfirmOutcome::NodeGone, |current, _| {
            match kube_patch::confirm_patch(current, fenced_at) {
                ConfirmPatch::Apply(patch) => Write::Patch(patch, ConfirmOutcome::Confirmed),
                ConfirmPatch::Already => Write::Answer(ConfirmOutcome::Confirmed),
                ConfirmPatch::NotFenced => Write::Answer(ConfirmOutcome::NotFenced),
                ConfirmPatch::AnotherFencing => Write::Answer(ConfirmOutcome::AnotherFencing),
                ConfirmPatch::NoResourceVersion => Write::Refuse,
            }
        })
        .await
    }

    async fn note_machine_off(
        &self,
        judged: &JudgedNode<'_>,
        note: &SeenOff,
    ) -> Result<bool, ClusterError> {
        let patch = kube_patch::seen_off_patch(judged.uid, note);
        // Gone, or another object of the name (its uid cannot change).
        self.merge_into_node(judged.name, &patch, |e| is_not_found(e) || is_conflict(e))
            .await
    }

    async fn mark_powered_off(&self, node: &str, stamp: &PowerStamp) -> Result<bool, ClusterError> {
        let patch = kube_patch::power_mark_patch(stamp);
        // Annotations only, merged: repeating it writes the same values.
        self.merge_into_node(node, &patch, is_not_found).await
    }

    async fn clear_power_mark(&self, node: &str) -> Result<(), ClusterError> {
        // Written under the Lease that wrote the mark; guarded by the
        // resourceVersion, since whether the label goes depends on the
        // Node as read.
        self.guarded_patch(node, (), |current, _| {
            Write::Patch(kube_patch::power_unmark_patch(current), ())
        })
        .await
    }

    async fn force_delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match retrying("delete pod", || api.delete(&pod.name, &params)).await {
            Ok(_) => Ok(()),
            // Gone, or another pod holds the name now (a retry after a lost
            // answer, a StatefulSet's replacement): the pod we meant is gone.
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
            Err(source) => Err(ClusterError::Pods {
                what: format!("force-deleting pod {}/{}", pod.namespace, pod.name),
                source,
            }),
        }
    }

    async fn delete_volume_attachment(&self, name: &str, uid: &str) -> Result<(), ClusterError> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match retrying("delete volumeattachment", || api.delete(name, &params)).await {
            Ok(_) => Ok(()),
            // Gone, or re-created for another attach under the same name.
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
            Err(source) => Err(ClusterError::DeleteVolumeAttachment {
                name: name.into(),
                source,
            }),
        }
    }

    async fn release_volumes_in_use(
        &self,
        node: &str,
        uid: Option<&str>,
        names: &[String],
    ) -> Result<ReleaseOutcome, ClusterError> {
        self.guarded_patch(node, ReleaseOutcome::NodeGone, |current, sent| {
            if uid.is_some_and(|uid| current.metadata.uid.as_deref() != Some(uid)) {
                return Write::Answer(ReleaseOutcome::NodeGone);
            }
            match in_use::release_patch(current, names) {
                ReleasePatch::Apply(patch, n) => {
                    Write::PatchStatus(patch, ReleaseOutcome::Released(n))
                }
                // A release whose answer was lost shows as nothing listed.
                ReleasePatch::NoneListed => {
                    Write::Answer(sent.unwrap_or(ReleaseOutcome::NoneListed))
                }
                ReleasePatch::NoResourceVersion => Write::Refuse,
            }
        })
        .await
    }
}

/// The `events.k8s.io` Event node-fencer records about `node`, in
/// `namespace`, named `name` (fixed by the occasion).
fn event_object(
    node: &str,
    event: &NodeEvent,
    name: &str,
    namespace: &str,
    instance: &str,
) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        action: Some(event.reason.action().into()),
        reason: Some(event.reason.as_str().into()),
        note: Some(truncate(&event.note, 1024)),
        type_: Some(
            if event.reason.warning() {
                "Warning"
            } else {
                "Normal"
            }
            .into(),
        ),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some(format!("{MANAGER}.io/{MANAGER}")),
        reporting_instance: Some(truncate(instance, 128)),
        ..Event::default()
    }
}

/// `ev` as an object of another version of the API with the same fields
/// (v1beta1's are v1's): the body names its own version, as the server
/// checks it against the path's.
fn versioned(ev: &Event, api: EventsApi) -> Result<DynamicObject, serde_json::Error> {
    let mut value = serde_json::to_value(ev)?;
    value["apiVersion"] = api.api_version().into();
    serde_json::from_value(value)
}
