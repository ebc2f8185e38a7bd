//! [`ClusterReads`] over `kube`: Nodes (slim, paged), VolumeAttachments,
//! PersistentVolumes, pods, the server version.

use super::*;
#[async_trait]
impl ClusterReads for Kube {
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        self.node_facts(&ListParams::default()).await
    }

    async fn get_node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError> {
        let node: Option<slim::SlimNode> = self
            .get_slim(slim::NODES, name, "get node")
            .await
            .map_err(|source| ClusterError::GetNode {
                node: name.into(),
                source,
            })?;
        Ok(node.and_then(|n| self.facts(Node::from(n))))
    }

    async fn list_fenced_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        let selector = format!("{}=true", kube_read::LABEL_FENCED);
        self.node_facts(&ListParams::default().labels(&selector))
            .await
    }

    async fn count_nodes(&self) -> Result<usize, ClusterError> {
        let params = ListParams::default().limit(1);
        let page: slim::List<slim::SlimNode> =
            retrying("count nodes", || self.list_with(slim::NODES, &params))
                .await
                .map_err(ClusterError::ListNodes)?;
        let more_pages = page
            .metadata
            .continue_token
            .as_deref()
            .is_some_and(|t| !t.is_empty());
        match page.metadata.remaining_item_count {
            Some(more) => Ok(page.items.len() + usize::try_from(more).unwrap_or(0)),
            None if !more_pages => Ok(page.items.len()),
            // A server that does not count what is left (before 1.16, where
            // `remainingItemCount` was off by default): counted page by page,
            // each Node read as nothing.
            None => self
                .list_all::<serde::de::IgnoredAny>(
                    slim::NODES,
                    &ListParams::default(),
                    "count nodes",
                )
                .await
                .map(|all| all.len())
                .map_err(ClusterError::ListNodes),
        }
    }

    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError> {
        let vas: Vec<slim::SlimVolumeAttachment> = self
            .list_all(
                slim::VOLUME_ATTACHMENTS,
                &ListParams::default(),
                "list volumeattachments",
            )
            .await
            .map_err(ClusterError::ListVolumeAttachments)?;
        Ok(vas
            .into_iter()
            .filter_map(|va| kube_read::attachment_facts(&VolumeAttachment::from(va)))
            .collect())
    }

    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError> {
        let pvs: Vec<slim::SlimPersistentVolume> = self
            .list_all(
                slim::PERSISTENT_VOLUMES,
                &ListParams::default(),
                "list persistentvolumes",
            )
            .await
            .map_err(ClusterError::ListPersistentVolumes)?;
        Ok(pvs
            .into_iter()
            .filter_map(|pv| kube_read::pv_facts(&PersistentVolume::from(pv)))
            .collect())
    }

    async fn get_volume_attachment(
        &self,
        name: &str,
    ) -> Result<Option<AttachmentFacts>, ClusterError> {
        let va: Option<slim::SlimVolumeAttachment> = self
            .get_slim(slim::VOLUME_ATTACHMENTS, name, "get volumeattachment")
            .await
            .map_err(|source| ClusterError::GetVolume {
                kind: "volumeattachment",
                name: name.into(),
                source,
            })?;
        Ok(va.and_then(|va| kube_read::attachment_facts(&VolumeAttachment::from(va))))
    }

    async fn get_persistent_volume(&self, name: &str) -> Result<Option<PvFacts>, ClusterError> {
        let pv: Option<slim::SlimPersistentVolume> = self
            .get_slim(slim::PERSISTENT_VOLUMES, name, "get persistentvolume")
            .await
            .map_err(|source| ClusterError::GetVolume {
                kind: "persistentvolume",
                name: name.into(),
                source,
            })?;
        Ok(pv.and_then(|pv| kube_read::pv_facts(&PersistentVolume::from(pv))))
    }

    async fn server_version(&self) -> Result<ServerVersion, ClusterError> {
        let ask = || async {
            let info = retrying("get version", || self.client.apiserver_version())
                .await
                .map_err(|e| ClusterError::Version(e.to_string()))?;
            ServerVersion::read(&info.major, &info.minor, &info.git_version).ok_or_else(|| {
                ClusterError::Version(format!(
                    "unreadable version major={:?} minor={:?} gitVersion={:?}",
                    info.major, info.minor, info.git_version
                ))
            })
        };
        self.version.get_or_try_init(ask).await.copied()
    }

    async fn node_lease(&self, node: &str, uid: Option<&str>) -> Result<LeaseRead, ClusterError> {
        let (lease, server_now) = retrying("get node lease", || self.get_dated_lease(node))
            .await
            .map_err(|source| ClusterError::GetNodeLease {
                node: node.into(),
                source,
            })?;
        Ok(silence::lease::read(lease.as_ref(), uid, server_now))
    }

    async fn pods_on_node(
        &self,
        node: &str,
        out_of_service: &[String],
    ) -> Result<Vec<PodRef>, ClusterError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = retrying("list pods", || api.list(&params))
            .await
            .map_err(|source| ClusterError::Pods {
                what: format!("listing the pods of node {node}"),
                source,
            })?;
        Ok(list
            .items
            .iter()
            .filter_map(|p| kube_read::pod_ref(p, out_of_service))
            .collect())
    }
}
