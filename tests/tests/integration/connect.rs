//! Reaching the cluster and the token stores as the function does in Lambda:
//! kubeconfigs and webhook tokens from SSM SecureString parameters and
//! Secrets Manager secrets (moto), used against the real API server.

use std::collections::HashMap;

use aws_sdk_ssm::types::ParameterType;
use node_fencer::core::settings::config::Config;
use node_fencer::shell::cluster::{ClusterReads, Kube};
use node_fencer::shell::connect::{Clients, ConnectError};
use node_fencer_tests::fixtures::unique;
use node_fencer_tests::stack;

fn config(pairs: &[(&str, &str)]) -> Config {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned()).expect("valid configuration")
}

#[tokio::test]
async fn kubeconfig_and_token_from_ssm_and_secrets_manager() -> anyhow::Result<()> {
    let s = stack();
    let sdk = s.sdk_config().await;
    let kubeconfig = std::fs::read_to_string(s.var("NODE_FENCER_KUBECONFIG_RESTRICTED"))?;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let sm = aws_sdk_secretsmanager::Client::new(&sdk);
    let param = format!("/node-fencer/{}/kubeconfig", unique("t"));
    ssm.put_parameter()
        .name(&param)
        .value(&kubeconfig)
        .r#type(ParameterType::SecureString)
        .send()
        .await?;
    let secret = unique("node-fencer-kubeconfig");
    sm.create_secret()
        .name(&secret)
        .secret_string(&kubeconfig)
        .send()
        .await?;
    let token_secret = unique("node-fencer-token");
    sm.create_secret()
        .name(&token_secret)
        .secret_string("a-token-from-secrets-manager")
        .send()
        .await?;
    let token_param = format!("/node-fencer/{}/token", unique("t"));
    ssm.put_parameter()
        .name(&token_param)
        .value("a-token-from-ssm-parameter")
        .r#type(ParameterType::SecureString)
        .send()
        .await?;

    for (var, value, token_var, token_value) in [
        (
            "KUBECONFIG_SSM_PARAMETER",
            &param,
            "WEBHOOK_TOKEN_SECRET_ID",
            &token_secret,
        ),
        (
            "KUBECONFIG_SECRET_ID",
            &secret,
            "WEBHOOK_TOKEN_SSM_PARAMETER",
            &token_param,
        ),
    ] {
        let clients = Clients::new(
            sdk.clone(),
            &config(&[(var, value), (token_var, token_value)]),
        );
        let cluster = Kube::new(clients.kube().await?, "tests");
        cluster.list_nodes().await?;
        assert!(clients.webhook_token().await?.is_some(), "{token_var}");
    }
    Ok(())
}

#[tokio::test]
async fn missing_or_weak_secrets_are_named_errors() -> anyhow::Result<()> {
    let s = stack();
    let sdk = s.sdk_config().await;
    let missing = format!("/node-fencer/{}/absent", unique("t"));
    let clients = Clients::new(
        sdk.clone(),
        &config(&[("KUBECONFIG_SSM_PARAMETER", &missing)]),
    );
    match clients.kube().await {
        Err(ConnectError::GetParameter { name, .. }) => assert_eq!(name, missing),
        other => panic!("expected GetParameter error, got {:?}", other.map(|_| ())),
    }
    let weak = unique("weak-token");
    aws_sdk_secretsmanager::Client::new(&sdk)
        .create_secret()
        .name(&weak)
        .secret_string("tiny-xyz")
        .send()
        .await?;
    let clients = Clients::new(sdk, &config(&[("WEBHOOK_TOKEN_SECRET_ID", &weak)]));
    let err = clients
        .webhook_token()
        .await
        .expect_err("a short token is refused");
    assert!(matches!(err, ConnectError::WeakToken(_)), "{err}");
    assert!(
        !err.to_string().contains("tiny-xyz"),
        "the token never shows: {err}"
    );
    Ok(())
}
