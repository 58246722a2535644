//! Redis Cluster hash slots, computed here the way the server does, so a
//! test can tell which node owns a key without asking. Kept apart from
//! fairlock-core's own computation on purpose: the kit does not depend on
//! the library it tests. Each is checked against the server's `CLUSTER
//! KEYSLOT` by its own tests.

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// The cluster's hash slot of `key`: CRC16 (XMODEM) of the key, or of its
/// hash tag (the part between the first `{` and the next `}`, when not
/// empty), modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16_xmodem(hashed) % SLOTS
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}
