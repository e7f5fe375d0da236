//! How to reach etcd: the connection flags every command that talks to it shares.

#[allow(unused_imports)]
use crate::prelude::*;

/// The connection a command used, to describe an etcd error it returns.
pub(crate) static USED: std::sync::OnceLock<ccattler_store::EtcdConfig> = std::sync::OnceLock::new();

/// An error for a person: an etcd error with the endpoint, the user and a hint.
pub(crate) fn describe(e: &anyhow::Error) -> String {
    match (e.downcast_ref::<etcd_client::Error>(), USED.get()) {
        (Some(etcd), Some(cfg)) => ccattler_store::etcd::describe_error(etcd, cfg),
        _ => format!("{e:#}"),
    }
}

/// How to reach etcd (shared by every command that talks to it), under a
/// heading of their own in `--help`, after the command's own flags.
#[derive(clap::Args, Clone)]
pub(crate) struct EtcdArgs {
    /// etcd endpoint(s), comma-separated.
    #[arg(long, env = "CCATTLER_ETCD", default_value = "http://127.0.0.1:2379", value_delimiter = ',', help_heading = "Connection (etcd)", global = true)]
    pub(crate) etcd: Vec<String>,
    /// etcd user (with --etcd-password) when auth is on.
    #[arg(long, env = "CCATTLER_ETCD_USER", help_heading = "Connection (etcd)", global = true)]
    pub(crate) etcd_user: Option<String>,
    /// etcd password (with --etcd-user).
    #[arg(long, env = "CCATTLER_ETCD_PASSWORD", hide_env_values = true, help_heading = "Connection (etcd)", global = true)]
    pub(crate) etcd_password: Option<String>,
    /// A credentials file (`NAME:PASSWORD` lines, mode 0600, written by
    /// `ccattler auth`): connect as the user named by --as.
    #[arg(long, env = "CCATTLER_CREDENTIALS", conflicts_with_all = ["etcd_user", "etcd_password"], help_heading = "Connection (etcd)", global = true)]
    pub(crate) credentials: Option<PathBuf>,
    /// The user of --credentials to connect as (root, controller, user, autoscaler, agent-NODE).
    #[arg(long = "as", env = "CCATTLER_AS", requires = "credentials", help_heading = "Connection (etcd)", global = true)]
    pub(crate) as_user: Option<String>,
    /// PEM file of the CA that signed etcd's certificate (for https:// endpoints).
    #[arg(long, env = "CCATTLER_ETCD_CA", help_heading = "Connection (etcd)", global = true)]
    pub(crate) etcd_ca: Option<PathBuf>,
    /// PEM client certificate (with --etcd-key) when etcd asks for one.
    #[arg(long, env = "CCATTLER_ETCD_CERT", help_heading = "Connection (etcd)", global = true)]
    pub(crate) etcd_cert: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long, env = "CCATTLER_ETCD_KEY", help_heading = "Connection (etcd)", global = true)]
    pub(crate) etcd_key: Option<PathBuf>,
}

impl EtcdArgs {
    pub(crate) fn config(&self) -> anyhow::Result<ccattler_store::EtcdConfig> {
        self.config_as(None)
    }

    /// The connection, as `default_user` of --credentials when --as is not given.
    pub(crate) fn config_as(&self, default_user: Option<&str>) -> anyhow::Result<ccattler_store::EtcdConfig> {
        let user = match (&self.etcd_user, &self.etcd_password, &self.credentials) {
            (Some(u), Some(p), _) => Some((u.clone(), p.clone())),
            (None, None, None) => None,
            (None, None, Some(file)) => {
                let Some(name) = self.as_user.as_deref().or(default_user) else {
                    anyhow::bail!("--credentials {} needs --as NAME (the user to connect as)", file.display())
                };
                let password = ccattler_store::credentials::password(file, name)?;
                Some((name.to_string(), password.to_string()))
            }
            _ => anyhow::bail!("--etcd-user and --etcd-password go together"),
        };
        if self.etcd_cert.is_some() != self.etcd_key.is_some() {
            anyhow::bail!("--etcd-cert and --etcd-key go together");
        }
        let files = (self.etcd_ca.is_some() || self.etcd_cert.is_some()).then(|| ccattler_store::etcd::TlsFiles {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        });
        // A missing or unreadable file is named now, not at connect time.
        let tls = files.map(|f| f.options()).transpose()?;
        let cfg = ccattler_store::EtcdConfig { endpoints: self.etcd.clone(), user, tls };
        // For an etcd error that reaches `main` (crate::cli): where and as whom.
        let _ = USED.set(cfg.clone());
        Ok(cfg)
    }
}
