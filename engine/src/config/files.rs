//! Secrets from files (`*_file` keys), as container platforms and systemd credentials
//! mount them: each file's content, less its trailing newline, becomes the secret. A
//! secret given both ways is refused, so that no one wonders which one is used.

use super::*;

impl Config {
    /// Reads every `*_file` key that is set into its secret.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the `*_file` key whose file cannot be read or is
    /// empty, or whose secret is also set directly.
    pub(super) fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        read_into("database.password_file", &self.database.password_file, &mut self.database.password)?;
        read_into("http.admin_token_file", &self.http.admin_token_file, &mut self.http.admin_token)?;
        read_into(
            "notifications.webhook_secret_file",
            &self.notifications.webhook_secret_file,
            &mut self.notifications.webhook_secret,
        )?;
        for client in &mut self.http.clients {
            let (key, path) = ("http.clients.token_sha256_file", &client.token_sha256_file);
            if path.is_empty() {
                continue;
            }
            if !client.token_sha256.is_empty() {
                return invalid(key, "is set, and so is http.clients.token_sha256: set one of them");
            }
            // One digest a line: several while a token is rotated.
            let digests = read(key, path)?;
            client.token_sha256 =
                digests.expose().lines().map(str::trim).filter(|l| !l.is_empty()).map(Secret::new).collect();
        }
        let kafka = &mut self.kafka;
        if !kafka.sasl_password_file.is_empty() {
            let elsewhere = [&kafka.common, &kafka.producer, &kafka.consumer];
            if elsewhere.iter().any(|properties| properties.contains_key("sasl.password")) {
                return invalid(
                    "kafka.sasl_password_file",
                    "is set, and so is \"sasl.password\" under kafka.common, kafka.producer or kafka.consumer: set \
                     one of them",
                );
            }
            let password = read("kafka.sasl_password_file", &kafka.sasl_password_file)?;
            kafka.common.insert("sasl.password".into(), password.expose().to_owned());
        }
        Ok(())
    }
}

fn read_into(key: &'static str, path: &str, secret: &mut Secret) -> Result<(), ConfigError> {
    if path.is_empty() {
        return Ok(());
    }
    if !secret.is_empty() {
        let direct = key.strip_suffix("_file").unwrap_or(key);
        return invalid(key, format!("is set, and so is {direct}: set one of them"));
    }
    *secret = read(key, path)?;
    Ok(())
}

fn read(key: &'static str, path: &str) -> Result<Secret, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => return Err(ConfigError::Invalid { key, problem: format!("cannot read {path}: {e}") }),
    };
    let value = text.strip_suffix('\n').map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if value.is_empty() {
        return Err(ConfigError::Invalid { key, problem: format!("{path} is empty") });
    }
    Ok(Secret::new(value))
}
