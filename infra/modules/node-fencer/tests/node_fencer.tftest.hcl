# `tofu test` of the module, plans only: each variable's validation refuses a
# value just out of its range, the preconditions refuse contradictory
# settings, and each switch creates what it should. The provider block and the
# overridden data sources let it plan without AWS credentials or calls, and
# tests/bootstrap.zip, an empty zip, stands in for the package; run it from
# infra/modules/node-fencer after `tofu init` (make infra-test does).

provider "aws" {
  region                      = "eu-west-1"
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
}

override_data {
  target = data.aws_caller_identity.current
  values = {
    account_id = "123456789012"
  }
}

override_data {
  target = data.aws_partition.current
  values = {
    partition = "aws"
  }
}

override_data {
  target = data.aws_region.current
  values = {
    region = "eu-west-1"
  }
}

variables {
  package_path = "tests/bootstrap.zip"
  cluster_name = "prod"
}

# --- switches ---------------------------------------------------------------------

run "eks_with_the_alertmanager_url" {
  command = plan

  assert {
    condition     = length(aws_lambda_function.this) == 2 && aws_lambda_function_url.this[0].function_name == "node-fencer-webhook"
    error_message = "the Function URL belongs to the webhook function, beside the main one"
  }
  assert {
    condition     = aws_lambda_function_url.this[0].authorization_type == "NONE"
    error_message = "Alertmanager cannot sign SigV4: the URL is public and the function checks the token"
  }
  assert {
    condition     = length(aws_eks_access_entry.this) == 1 && length(aws_secretsmanager_secret.webhook_token) == 1 && length(aws_ssm_parameter.webhook_token) == 0
    error_message = "EKS mode: one access entry; the token in Secrets Manager by default"
  }
  assert {
    condition     = aws_lambda_function.this["main"].timeout == 270 && aws_lambda_function.this["webhook"].timeout == 270
    error_message = "the default waits sum to 270 s"
  }
  assert {
    condition     = aws_lambda_function.this["main"].environment[0].variables["CLUSTER_NAME"] == "prod"
    error_message = "CLUSTER_NAME names the cluster"
  }
}

run "without_the_url_there_is_no_webhook_function_or_token" {
  command = plan

  variables {
    enable_alertmanager_url = false
  }

  assert {
    condition     = keys(aws_lambda_function.this) == ["main"] && length(aws_lambda_function_url.this) == 0
    error_message = "no webhook function and no URL"
  }
  assert {
    condition     = length(random_password.webhook_token) == 0 && length(aws_secretsmanager_secret.webhook_token) == 0
    error_message = "no token"
  }
  assert {
    condition     = !contains(keys(aws_lambda_function.this["main"].environment[0].variables), "WEBHOOK_TOKEN_SECRET_ID")
    error_message = "no token to read"
  }
}

run "self_managed_with_the_token_in_ssm_in_a_vpc_on_arm64" {
  command = plan

  variables {
    cluster_name                  = null
    kubeconfig_ssm_parameter_name = "/node-fencer/kubeconfig"
    webhook_token_store           = "ssm"
    architecture                  = "arm64"
    vpc_subnet_ids                = ["subnet-0123456789abcdef0"]
    vpc_security_group_ids        = ["sg-0123456789abcdef0"]
    recovery_schedule             = null
  }

  assert {
    condition     = length(aws_eks_access_entry.this) == 0 && length(aws_ssm_parameter.webhook_token) == 1 && length(aws_secretsmanager_secret.webhook_token) == 0
    error_message = "self-managed: no access entry; the token in SSM"
  }
  assert {
    condition     = aws_lambda_function.this["main"].architectures == tolist(["arm64"]) && length(aws_lambda_function.this["webhook"].vpc_config) == 1
    error_message = "arm64, in the VPC, both functions"
  }
  assert {
    condition     = aws_lambda_function.this["main"].environment[0].variables["KUBECONFIG_SSM_PARAMETER"] == "/node-fencer/kubeconfig"
    error_message = "the kubeconfig parameter is passed"
  }
  assert {
    condition     = length(aws_cloudwatch_event_rule.recovery) == 0 && output.recovery_rule_arn == null
    error_message = "no schedule"
  }
}

run "the_longest_waits_without_active_fencing" {
  command = plan

  variables {
    not_ready_wait_seconds        = 120
    confirm_again_after_seconds   = 120
    volume_detach_timeout_seconds = 180
    recovery_settle_seconds       = 120
    power_off_wait_seconds        = 120
  }

  assert {
    condition     = aws_lambda_function.this["main"].timeout == 780
    error_message = "120 + 30 + 120 + 2 x 180 + 120 + 30 = 780: the power-off wait counts only with active_fencing"
  }
}

run "the_longest_waits_with_active_fencing_fill_lambdas_900_seconds" {
  command = plan

  variables {
    active_fencing                = true
    not_ready_wait_seconds        = 120
    confirm_again_after_seconds   = 120
    volume_detach_timeout_seconds = 180
    recovery_settle_seconds       = 120
    power_off_wait_seconds        = 120
  }

  assert {
    condition     = aws_lambda_function.this["main"].timeout == 900 && aws_lambda_function.this["webhook"].timeout == 900
    error_message = "120 + 30 + 120 + 2 x 180 + 120 + 120 + 30 = 900"
  }
}

# --- active fencing -----------------------------------------------------------------

run "active_fencing_is_off_by_default" {
  command = plan

  variables {
    enable_alertmanager_url = false
  }

  assert {
    condition     = length(setintersection(keys(aws_lambda_function.this["main"].environment[0].variables), ["ACTIVE_FENCING", "POWER_OFF_AFTER_SECONDS", "POWER_OFF_WAIT_SECONDS", "PARTITION_PERCENT"])) == 0
    error_message = "off: none of the active fencing variables (the code refuses them without ACTIVE_FENCING=on)"
  }
  assert {
    condition     = !strcontains(data.aws_iam_policy_document.api.json, "ec2:StopInstances") && !strcontains(data.aws_iam_policy_document.api.json, "ec2:DescribeInstanceStatus")
    error_message = "off: neither StopInstances nor DescribeInstanceStatus is granted"
  }
  assert {
    condition     = output.power_off_instance_tag == null
    error_message = "off: no power-off tag"
  }
}

run "active_fencing_in_eks_mode" {
  command = plan

  variables {
    active_fencing          = true
    power_off_after_seconds = 300
    power_off_wait_seconds  = 60
    partition_percent       = 50
    enable_alertmanager_url = false
  }

  assert {
    condition = {
      for name, value in aws_lambda_function.this["main"].environment[0].variables : name => value
      if contains(["ACTIVE_FENCING", "POWER_OFF_AFTER_SECONDS", "POWER_OFF_WAIT_SECONDS", "PARTITION_PERCENT"], name)
      } == {
      ACTIVE_FENCING          = "on"
      POWER_OFF_AFTER_SECONDS = "300"
      POWER_OFF_WAIT_SECONDS  = "60"
      PARTITION_PERCENT       = "50"
    }
    error_message = "on: ACTIVE_FENCING=on and the three settings"
  }
  assert {
    condition     = aws_lambda_function.this["main"].timeout == 330
    error_message = "the default waits (270 s) and the power-off wait (60 s)"
  }
  assert {
    condition     = output.power_off_instance_tag == { key = "kubernetes.io/cluster/prod", value = "owned" }
    error_message = "EKS mode: the cluster's own tag by default"
  }
  assert {
    condition     = strcontains(data.aws_iam_policy_document.api.json, "\"aws:ResourceTag/kubernetes.io/cluster/prod\": \"owned\"")
    error_message = "StopInstances requires the cluster's tag"
  }
}

run "active_fencing_stuck_passes_stuck_and_grants_the_stop" {
  command = plan

  variables {
    active_fencing          = "stuck"
    enable_alertmanager_url = false
  }

  assert {
    condition     = aws_lambda_function.this["main"].environment[0].variables["ACTIVE_FENCING"] == "stuck" && aws_lambda_function.this["main"].environment[0].variables["POWER_OFF_AFTER_SECONDS"] == "120"
    error_message = "stuck: ACTIVE_FENCING=stuck and the settings with it"
  }
  assert {
    condition     = strcontains(data.aws_iam_policy_document.api.json, "ec2:StopInstances") && aws_lambda_function.this["main"].timeout == 390
    error_message = "stuck powers off as on does: the stop granted, the power-off wait in the timeout"
  }
}

run "active_fencing_takes_off_stuck_or_on_only" {
  command = plan

  variables {
    active_fencing = "yes"
  }

  expect_failures = [var.active_fencing]
}

run "active_fencing_with_an_explicit_tag_in_eks_mode" {
  command = plan

  variables {
    active_fencing          = true
    power_off_instance_tag  = { key = "team", value = "platform" }
    enable_alertmanager_url = false
  }

  assert {
    condition     = output.power_off_instance_tag == { key = "team", value = "platform" } && strcontains(data.aws_iam_policy_document.api.json, "\"aws:ResourceTag/team\": \"platform\"")
    error_message = "an explicit power_off_instance_tag wins over the EKS default"
  }
}

run "active_fencing_self_managed_with_a_tag" {
  command = plan

  variables {
    cluster_name                  = null
    kubeconfig_ssm_parameter_name = "/node-fencer/kubeconfig"
    active_fencing                = true
    power_off_instance_tag        = { key = "kubernetes.io/cluster/lab", value = "owned" }
  }

  assert {
    condition     = aws_lambda_function.this["main"].environment[0].variables["ACTIVE_FENCING"] == "on" && output.power_off_instance_tag.key == "kubernetes.io/cluster/lab"
    error_message = "self-managed with its tag: active fencing on"
  }
}

run "active_fencing_denies_stopping_a_control_plane_instance" {
  command = plan

  variables {
    active_fencing          = true
    enable_alertmanager_url = false
  }

  assert {
    condition     = length([for st in jsondecode(data.aws_iam_policy_document.api.json).Statement : st if st.Effect == "Deny" && st.Action == "ec2:StopInstances" && st.Resource == "arn:aws:ec2:eu-west-1:123456789012:instance/*"]) == 3
    error_message = "one Deny of ec2:StopInstances for each control-plane tag"
  }
  assert {
    condition     = strcontains(data.aws_iam_policy_document.api.json, "\"aws:ResourceTag/k8s.io/role/control-plane\": \"*\"") && strcontains(data.aws_iam_policy_document.api.json, "\"aws:ResourceTag/k8s.io/role/master\": \"*\"") && strcontains(data.aws_iam_policy_document.api.json, "\"aws:ResourceTag/sigs.k8s.io/cluster-api-provider-aws/role\": \"control-plane\"")
    error_message = "kOps' tags, old and new, and Cluster API's, any value of kOps'"
  }
  assert {
    condition     = !contains(keys(aws_lambda_function.this["main"].environment[0].variables), "POWER_OFF_CONTROL_PLANE")
    error_message = "unset unless allowed: the code's default is false"
  }
}

run "power_off_control_plane_drops_the_deny" {
  command = plan

  variables {
    active_fencing          = true
    power_off_control_plane = true
    enable_alertmanager_url = false
  }

  assert {
    condition     = length([for st in jsondecode(data.aws_iam_policy_document.api.json).Statement : st if st.Effect == "Deny"]) == 0
    error_message = "allowed: no Deny"
  }
  assert {
    condition     = aws_lambda_function.this["main"].environment[0].variables["POWER_OFF_CONTROL_PLANE"] == "true"
    error_message = "allowed: POWER_OFF_CONTROL_PLANE=true"
  }
}

run "an_operators_own_control_plane_tag" {
  command = plan

  variables {
    active_fencing              = true
    control_plane_instance_tags = [{ key = "node-role", value = "control-plane" }]
    enable_alertmanager_url     = false
  }

  assert {
    condition     = length([for st in jsondecode(data.aws_iam_policy_document.api.json).Statement : st if st.Effect == "Deny"]) == 1 && strcontains(data.aws_iam_policy_document.api.json, "\"aws:ResourceTag/node-role\": \"control-plane\"")
    error_message = "the operator's tag alone"
  }
}

run "power_off_control_plane_without_active_fencing_passes_nothing" {
  command = plan

  variables {
    power_off_control_plane = true
    enable_alertmanager_url = false
  }

  assert {
    condition     = !contains(keys(aws_lambda_function.this["main"].environment[0].variables), "POWER_OFF_CONTROL_PLANE") && !strcontains(data.aws_iam_policy_document.api.json, "ec2:StopInstances")
    error_message = "no power-off at all without active fencing"
  }
}

# --- the detach scope ---------------------------------------------------------------

run "the_detach_keys_on_the_drivers_tag_of_every_cluster_by_default" {
  command = plan

  variables {
    enable_alertmanager_url = false
  }

  assert {
    condition     = strcontains(data.aws_iam_policy_document.api.json, "\"aws:ResourceTag/ebs.csi.aws.com/cluster\": \"true\"")
    error_message = "the EBS CSI driver's tag of every volume it creates"
  }
}

run "the_detach_keys_on_this_clusters_tag_with_its_id" {
  command = plan

  variables {
    detach_volume_cluster_id = "prod-eu"
    enable_alertmanager_url  = false
  }

  assert {
    condition     = strcontains(data.aws_iam_policy_document.api.json, "\"aws:ResourceTag/kubernetes.io/cluster/prod-eu\": \"owned\"") && !strcontains(data.aws_iam_policy_document.api.json, "ebs.csi.aws.com/cluster")
    error_message = "the tag --k8s-tag-cluster-id writes, instead of the account-wide one"
  }
}

run "active_fencing_self_managed_without_a_tag_is_refused" {
  command = plan

  variables {
    cluster_name                  = null
    kubeconfig_ssm_parameter_name = "/node-fencer/kubeconfig"
    active_fencing                = true
  }

  expect_failures = [data.aws_iam_policy_document.api]
}

# --- preconditions ------------------------------------------------------------------

run "notifications_to_a_created_topic_with_e_mail_subscriptions" {
  command = plan

  variables {
    create_notification_topic = true
    notification_emails       = ["oncall@example.com"]
  }

  assert {
    condition     = aws_sns_topic.notifications[0].name == "node-fencer-notifications" && aws_sns_topic.notifications[0].kms_master_key_id == "alias/aws/sns"
    error_message = "the created topic is named after the function and encrypted with the AWS-managed key"
  }
  assert {
    condition     = aws_sns_topic_subscription.email["oncall@example.com"].protocol == "email"
    error_message = "each address is an e-mail subscription of the created topic"
  }
  assert {
    condition     = aws_lambda_function.this["main"].environment[0].variables["NOTIFY_TOPIC"] == "arn:aws:sns:eu-west-1:123456789012:node-fencer-notifications" && output.notification_topic_arn == "arn:aws:sns:eu-west-1:123456789012:node-fencer-notifications"
    error_message = "NOTIFY_TOPIC and the output name the created topic"
  }
}

run "notifications_to_a_given_topic" {
  command = plan

  variables {
    notification_topic_arn = "arn:aws:sns:eu-west-1:123456789012:platform-alerts"
  }

  assert {
    condition     = length(aws_sns_topic.notifications) == 0 && aws_lambda_function.this["main"].environment[0].variables["NOTIFY_TOPIC"] == "arn:aws:sns:eu-west-1:123456789012:platform-alerts"
    error_message = "a given topic is published to, none created"
  }
}

run "no_notifications_by_default" {
  command = plan

  assert {
    condition     = length(aws_sns_topic.notifications) == 0 && !contains(keys(aws_lambda_function.this["main"].environment[0].variables), "NOTIFY_TOPIC") && output.notification_topic_arn == null
    error_message = "no topic, no NOTIFY_TOPIC without the settings"
  }
}

run "a_created_and_a_given_topic_are_refused" {
  command = plan

  variables {
    create_notification_topic = true
    notification_topic_arn    = "arn:aws:sns:eu-west-1:123456789012:platform-alerts"
  }

  expect_failures = [aws_lambda_function.this]
}

run "e_mails_without_a_created_topic_are_refused" {
  command = plan

  variables {
    notification_emails = ["oncall@example.com"]
  }

  expect_failures = [aws_lambda_function.this]
}

run "a_fifo_topic_is_refused" {
  command = plan

  variables {
    notification_topic_arn = "arn:aws:sns:eu-west-1:123456789012:alerts.fifo"
  }

  expect_failures = [var.notification_topic_arn]
}

run "an_e_mail_subscription_needs_an_address" {
  command = plan

  variables {
    create_notification_topic = true
    notification_emails       = ["oncall"]
  }

  expect_failures = [var.notification_emails]
}

run "two_ways_to_the_cluster_are_refused" {
  command = plan

  variables {
    kubeconfig_ssm_parameter_name = "/node-fencer/kubeconfig"
  }

  expect_failures = [aws_lambda_function.this]
}

run "an_endpoint_without_its_ca_is_refused" {
  command = plan

  variables {
    cluster_endpoint = "https://0123456789ABCDEF.gr7.eu-west-1.eks.amazonaws.com"
  }

  expect_failures = [aws_lambda_function.this]
}

run "both_functions_unreserved_is_refused" {
  command = plan

  variables {
    reserved_concurrent_executions         = -1
    webhook_reserved_concurrent_executions = -1
  }

  expect_failures = [aws_lambda_function_url.this]
}

# --- variable validations: one value just out of range each ------------------------

run "name_too_long" {
  command = plan
  variables {
    name = "a-name-of-forty-nine-characters-is-one-too-many-x"
  }
  expect_failures = [var.name]
}

run "package_not_a_zip" {
  command = plan
  variables {
    package_path = "tests/bootstrap"
  }
  expect_failures = [var.package_path]
}

run "architecture_unknown" {
  command = plan
  variables {
    architecture = "aarch64"
  }
  expect_failures = [var.architecture]
}

run "memory_below_lambdas_minimum" {
  command = plan
  variables {
    memory_size = 127
  }
  expect_failures = [var.memory_size]
}

run "zero_reserved_concurrency" {
  command = plan
  variables {
    reserved_concurrent_executions = 0
  }
  expect_failures = [var.reserved_concurrent_executions]
}

run "zero_webhook_reserved_concurrency" {
  command = plan
  variables {
    webhook_reserved_concurrent_executions = 0
  }
  expect_failures = [var.webhook_reserved_concurrent_executions]
}

run "confirm_again_above_120" {
  command = plan
  variables {
    confirm_again_after_seconds = 121
  }
  expect_failures = [var.confirm_again_after_seconds]
}

run "detach_timeout_above_180" {
  command = plan
  variables {
    volume_detach_timeout_seconds = 181
  }
  expect_failures = [var.volume_detach_timeout_seconds]
}

run "detach_timeout_zero" {
  command = plan
  variables {
    volume_detach_timeout_seconds = 0
  }
  expect_failures = [var.volume_detach_timeout_seconds]
}

run "not_ready_wait_above_120" {
  command = plan
  variables {
    not_ready_wait_seconds = 121
  }
  expect_failures = [var.not_ready_wait_seconds]
}

run "settle_above_120" {
  command = plan
  variables {
    recovery_settle_seconds = 121
  }
  expect_failures = [var.recovery_settle_seconds]
}

run "power_off_after_below_60" {
  command = plan
  variables {
    power_off_after_seconds = 59
  }
  expect_failures = [var.power_off_after_seconds]
}

run "power_off_after_above_3600" {
  command = plan
  variables {
    power_off_after_seconds = 3601
  }
  expect_failures = [var.power_off_after_seconds]
}

run "power_off_wait_below_10" {
  command = plan
  variables {
    power_off_wait_seconds = 9
  }
  expect_failures = [var.power_off_wait_seconds]
}

run "power_off_wait_above_120" {
  command = plan
  variables {
    power_off_wait_seconds = 121
  }
  expect_failures = [var.power_off_wait_seconds]
}

run "partition_percent_zero" {
  command = plan
  variables {
    partition_percent = 0
  }
  expect_failures = [var.partition_percent]
}

run "partition_percent_above_100" {
  command = plan
  variables {
    partition_percent = 101
  }
  expect_failures = [var.partition_percent]
}

run "power_off_tag_without_a_key" {
  command = plan
  variables {
    power_off_instance_tag = { key = "", value = "owned" }
  }
  expect_failures = [var.power_off_instance_tag]
}

run "control_plane_tag_without_a_key" {
  command = plan
  variables {
    control_plane_instance_tags = [{ key = "", value = "*" }]
  }
  expect_failures = [var.control_plane_instance_tags]
}

run "detach_cluster_id_empty" {
  command = plan
  variables {
    detach_volume_cluster_id = ""
  }
  expect_failures = [var.detach_volume_cluster_id]
}

run "vpc_id_malformed" {
  command = plan
  variables {
    cluster_vpc_id = "vpc-0123"
  }
  expect_failures = [var.cluster_vpc_id]
}

run "cluster_tag_without_a_key" {
  command = plan
  variables {
    cluster_tag = "=owned"
  }
  expect_failures = [var.cluster_tag]
}

run "secret_arn_without_its_suffix" {
  command = plan
  variables {
    cluster_name          = null
    kubeconfig_secret_arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/kubeconfig"
  }
  expect_failures = [var.kubeconfig_secret_arn]
}

run "instance_id_malformed" {
  command = plan
  variables {
    instance_ids = ["i-xyz"]
  }
  expect_failures = [var.instance_ids]
}

run "schedule_not_an_expression" {
  command = plan
  variables {
    recovery_schedule = "every 10 minutes"
  }
  expect_failures = [var.recovery_schedule]
}

run "event_age_below_a_minute" {
  command = plan
  variables {
    event_maximum_age_seconds = 59
  }
  expect_failures = [var.event_maximum_age_seconds]
}

run "event_retries_above_185" {
  command = plan
  variables {
    event_maximum_retry_attempts = 186
  }
  expect_failures = [var.event_maximum_retry_attempts]
}

run "async_age_above_six_hours" {
  command = plan
  variables {
    async_maximum_event_age_seconds = 21601
  }
  expect_failures = [var.async_maximum_event_age_seconds]
}

run "async_retries_above_2" {
  command = plan
  variables {
    async_maximum_retry_attempts = 3
  }
  expect_failures = [var.async_maximum_retry_attempts]
}

run "retention_cloudwatch_does_not_offer" {
  command = plan
  variables {
    log_retention_days = 31
  }
  expect_failures = [var.log_retention_days]
}

run "token_store_unknown" {
  command = plan
  variables {
    webhook_token_store = "vault"
  }
  expect_failures = [var.webhook_token_store]
}

run "recovery_window_below_7" {
  command = plan
  variables {
    secret_recovery_window_days = 6
  }
  expect_failures = [var.secret_recovery_window_days]
}
