//! Raw script replies and the error for replies that break the protocol.

/// A script reply, independent of the Redis client that fetched it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An integer.
    Int(i64),
    /// A bulk or simple string that is valid UTF-8.
    Str(String),
    /// A bulk string that is not valid UTF-8 (a binary value), byte for
    /// byte. Text always arrives as [`Reply::Str`]; use
    /// [`Reply::as_bytes`] to read a value that may be either.
    Bytes(Vec<u8>),
    /// An array of replies.
    Array(Vec<Reply>),
    /// A null reply.
    Nil,
}

/// A reply that does not have the shape the script's header promises.
///
/// Seeing one means the scripts in Redis are not the ones this crate
/// expects (for example another fairlock version loaded them under the
/// same SHA, which cannot happen, or a proxy rewrote the reply).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected reply from script {script}: {detail}; the scripts in Redis do not match this fairlock version, or a proxy rewrote the reply: run one fairlock version against this Redis and connect to it directly")]
pub struct ProtocolError {
    /// The script whose reply was malformed.
    pub script: &'static str,
    /// What was wrong with it.
    pub detail: String,
}

impl Reply {
    /// A string reply, text or binary, as its exact bytes; `None` for
    /// integers, arrays and nil.
    ///
    /// ```
    /// use fairlock_core::Reply;
    /// assert_eq!(Reply::Str("ok".into()).as_bytes(), Some(&b"ok"[..]));
    /// assert_eq!(Reply::Bytes(vec![0xff, 0]).as_bytes(), Some(&[0xff, 0][..]));
    /// assert_eq!(Reply::Int(1).as_bytes(), None);
    /// ```
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Str(text) => Some(text.as_bytes()),
            Reply::Bytes(bytes) => Some(bytes),
            Reply::Int(_) | Reply::Array(_) | Reply::Nil => None,
        }
    }

    /// A bulk string as received: [`Reply::Str`] if it is UTF-8, else
    /// [`Reply::Bytes`], so no byte is ever replaced.
    pub fn from_bulk(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) => Reply::Str(text),
            Err(binary) => Reply::Bytes(binary.into_bytes()),
        }
    }

    pub(crate) fn into_array(self, script: &'static str) -> Result<Vec<Reply>, ProtocolError> {
        match self {
            Reply::Array(items) => Ok(items),
            other => Err(ProtocolError {
                script,
                detail: format!("expected an array, got {other:?}"),
            }),
        }
    }
}

/// Reads typed fields off an array reply, naming the script on error.
pub(crate) struct Fields {
    script: &'static str,
    items: std::vec::IntoIter<Reply>,
}

impl Fields {
    pub(crate) fn new(script: &'static str, reply: Reply) -> Result<Self, ProtocolError> {
        Ok(Self {
            script,
            items: reply.into_array(script)?.into_iter(),
        })
    }

    pub(crate) fn error(&self, detail: String) -> ProtocolError {
        ProtocolError {
            script: self.script,
            detail,
        }
    }

    pub(crate) fn int(&mut self) -> Result<i64, ProtocolError> {
        match self.items.next() {
            Some(Reply::Int(value)) => Ok(value),
            Some(Reply::Str(text)) => text
                .parse()
                .map_err(|_| self.error(format!("expected an integer, got {text:?}"))),
            other => Err(self.error(format!("expected an integer, got {other:?}"))),
        }
    }

    pub(crate) fn uint(&mut self) -> Result<u64, ProtocolError> {
        let value = self.int()?;
        u64::try_from(value)
            .map_err(|_| self.error(format!("expected a non-negative integer, got {value}")))
    }

    pub(crate) fn string(&mut self) -> Result<String, ProtocolError> {
        match self.items.next() {
            Some(Reply::Str(text)) => Ok(text),
            Some(Reply::Nil) => Ok(String::new()),
            other => Err(self.error(format!("expected a string, got {other:?}"))),
        }
    }

    /// A string field that may carry a value another program wrote: text
    /// as it is, a value that is not UTF-8 lossily (U+FFFD for each
    /// invalid sequence), nil as "". Only for a field whose exact bytes
    /// matter to nobody unless they are text fairlock wrote.
    pub(crate) fn lossy_string(&mut self) -> Result<String, ProtocolError> {
        match self.items.next() {
            Some(Reply::Bytes(bytes)) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Some(Reply::Str(text)) => Ok(text),
            Some(Reply::Nil) => Ok(String::new()),
            other => Err(self.error(format!("expected a string, got {other:?}"))),
        }
    }

    /// Reads optional trailing fields with `read`; if they are missing or
    /// are not what `read` expects (fields a later script version added),
    /// `None`, with nothing consumed.
    pub(crate) fn optional<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Result<T, ProtocolError>,
    ) -> Option<T> {
        let before = self.items.clone();
        match read(self) {
            Ok(value) => Some(value),
            Err(_) => {
                self.items = before;
                None
            }
        }
    }

    pub(crate) fn next(&mut self) -> Option<Reply> {
        self.items.next()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn unknown_status(&self, status: i64) -> ProtocolError {
        self.error(format!("unknown status {status}"))
    }
}
