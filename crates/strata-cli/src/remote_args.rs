//! `--remote` and friends: the second memory tier (Valkey/Redis) for commands that open a
//! database. The URL may carry a password; pass it in `STRATA_REMOTE` to keep it out of the
//! process list. It is never printed (errors show it as `***`).

use std::sync::Arc;

use clap::Args;
use strata::{Config, Error};
use strata_remote::{prefix_for_dir, RedisTier, RemoteConfig};

/// Options of the remote tier.
#[derive(Args, Debug, Default, Clone)]
pub struct RemoteArgs {
    /// Second memory tier for clean evicted pages: redis://[USER:PASSWORD@]HOST:PORT,
    /// unix:///PATH or redis+cluster://HOST:PORT,HOST:PORT,... (Valkey or Redis).
    #[arg(long, env = "STRATA_REMOTE", hide_env_values = true)]
    pub remote: Option<String>,
    /// Bytes this database may occupy in the remote tier (default: the server's maxmemory
    /// decides).
    #[arg(long, value_parser = crate::parse_size, requires = "remote")]
    pub remote_budget: Option<u64>,
    /// At exit, store the hot set in the remote tier; at the next start with this flag, warm
    /// the pool from it (if the database did not change in between).
    #[arg(long, requires = "remote")]
    pub warm_restart: bool,
}

impl RemoteArgs {
    /// Adds the tier (connected and authenticated now, so a wrong URL or password fails
    /// before any work) to `config`.
    pub fn apply(&self, config: Config) -> Result<Config, Error> {
        let Some(url) = &self.remote else { return Ok(config) };
        let mut remote = RemoteConfig::new(url).map_err(|e| Error::InvalidConfig(e.to_string()))?;
        let dir = std::path::absolute(config.dir()).unwrap_or_else(|_| config.dir().to_owned());
        remote = remote.prefix(prefix_for_dir(&dir));
        if let Some(b) = self.remote_budget {
            remote = remote.budget(b);
        }
        let tier = RedisTier::connect(remote).map_err(|e| Error::InvalidConfig(e.to_string()))?;
        Ok(config.remote_tier(Arc::new(tier)).warm_restart(self.warm_restart))
    }
}
