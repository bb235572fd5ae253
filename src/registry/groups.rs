//! Per-thread `ncclGroupStart`/`ncclGroupEnd` depth, mirroring NCCL's thread-local counter.

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Records a `ncclGroupStart` that NCCL accepted.
pub fn enter() {
    DEPTH.with(|d| d.set(d.get().saturating_add(1)));
}

/// Records a `ncclGroupEnd`. NCCL leaves the group whatever the end's result, except when the
/// thread was not in one; so does this. Returns the depth after it.
pub fn leave() -> u32 {
    DEPTH.with(|d| {
        let depth = d.get().saturating_sub(1);
        d.set(depth);
        depth
    })
}

/// The calling thread's group depth: 0 outside any group.
pub fn depth() -> u32 {
    DEPTH.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_nests_per_thread_and_never_underflows() {
        assert_eq!(depth(), 0);
        enter();
        enter();
        assert_eq!(depth(), 2);
        std::thread::spawn(|| assert_eq!(depth(), 0))
            .join()
            .unwrap();
        assert_eq!(leave(), 1);
        assert_eq!(leave(), 0);
        assert_eq!(leave(), 0);
    }
}
