//! The setup's second step through host memory: whether every rank's local steps worked (its
//! peers' staging opened and probed, its GPU's own probe of them passed), agreed without a
//! collective of NCCL's.
//!
//! Each rank's page (its failure word's, `super::super::failure`) holds one word for it,
//! written once: 0 until settled, then [`WORKED`], [`FAILED`] or [`TIMED_OUT`]. A rank first
//! opens every rank's page (so that once its word is settled it needs no page of a peer's
//! that the peer might since have unlinked), then settles its own word to what its steps gave,
//! then waits for every peer's word. A peer's word still 0 at the deadline is settled by the
//! waiter as timed out: the first write wins, so a peer that comes later finds it settled and
//! declines too. Every word ends settled exactly once and every rank reads the same values, so
//! every rank reaches the same decision, naming the same first rank that did not work. A rank
//! that could not open a peer's page settles its own word as failed and counts the unread page
//! as worked (its own failure already refuses): the refusal is the same everywhere, and so is
//! the rank it names unless the unread page's rank failed too. A rank that could not open its
//! own page leaves its word to its peers, who settle it as timed out. A peer whose failure word
//! is set (it gave up, or was aborted) is settled as failed at once, and a rank that is itself
//! marked failed stops waiting, settling what is still unset as timed out.
//!
//! Why not an all-gather through NCCL: a rank whose GPU context is lost (its GPU probe faulted)
//! cannot take part in one, and its peers would wait in it with the host blocked, where no
//! watchdog sees a call; and a collective may not be given up on one rank alone, since the
//! ranks' later calls of NCCL would then pair with the wrong collectives. A host whose context
//! is lost can still write its word, and a deadline bounds every wait.
//!
//! Why not the rounds of `super::super::rank::agreement` (the arenas' growth, capture votes):
//! they wait through a connected rank's table of its peers' pages, which a rank whose local
//! steps failed may never have built, and their deadline fails the waiting rank alone; here a
//! late word is settled for everyone, so a deadline never splits the ranks.

use std::time::{Duration, Instant};

use crate::engine::cuda::failure::FailureWord;

/// A rank's word: its local steps worked.
const WORKED: u32 = 1;
/// A rank's word: its local steps failed, or it could not open a peer's page.
const FAILED: u32 = 2;
/// A rank's word, settled by a peer: it had not settled it by that peer's deadline.
const TIMED_OUT: u32 = 3;

/// How long a rank waits for its peers' words in all, from when it settled its own. Beyond the
/// GPU probe's own bound (10 s), so that a rank whose probe gives no verdict is seen failed,
/// not timed out.
pub const AGREEMENT_DEADLINE: Duration = Duration::from_secs(30);

/// Agrees through the pages named `pages` (every rank's, in rank order) on whether every rank's
/// local steps worked, this rank (`me`) saying `worked`: each rank's flag, 1 where its word
/// reads [`WORKED`], for `peer_verdict`. Waits at most `deadline` in all, from when this rank
/// settled its own word.
pub fn agree_through_pages(
    me: usize,
    worked: bool,
    pages: &[String],
    deadline: Duration,
) -> Vec<u32> {
    let opened: Vec<Option<FailureWord>> = pages
        .iter()
        .map(|name| match FailureWord::open_host(name) {
            Ok(page) => Some(page),
            Err(e) => {
                log::warn!("the setup's agreement: cannot open a rank's page {e}");
                None
            }
        })
        .collect();
    let all_opened = opened.iter().all(Option::is_some);
    let own = opened.get(me).and_then(Option::as_ref);
    // Without its own page, its word is its peers' to settle (as timed out).
    let mine = own.map_or(0, |own| {
        own.settle_setup(match worked && all_opened {
            true => WORKED,
            false => FAILED,
        })
    });
    let gave_up = || own.is_some_and(|own| own.get() != 0);
    let until = Instant::now() + deadline;
    opened
        .iter()
        .enumerate()
        .map(|(rank, page)| {
            let word = match page {
                // Unread: this rank's own word (failed) refuses for it.
                None => WORKED,
                Some(_) if rank == me => mine,
                Some(page) => settled(page, until, &gave_up),
            };
            u32::from(word == WORKED)
        })
        .collect()
}

/// What `page`'s word settles to: waited for until `until` (or until `gave_up` says this rank
/// was marked failed), then settled as timed out; settled as failed at once where the page's
/// rank is marked failed.
fn settled(page: &FailureWord, until: Instant, gave_up: &dyn Fn() -> bool) -> u32 {
    let mut pause = Duration::from_micros(50);
    loop {
        let word = page.setup_verdict();
        if word != 0 {
            return word;
        }
        if page.get() != 0 {
            return page.settle_setup(FAILED);
        }
        if Instant::now() >= until || gave_up() {
            return page.settle_setup(TIMED_OUT);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages for `n` ranks, created as their owners would, and their names.
    fn pages(n: usize) -> (Vec<FailureWord>, Vec<String>) {
        let pages: Vec<FailureWord> = (0..n)
            .map(|_| FailureWord::create_host().unwrap())
            .collect();
        let names = pages.iter().map(|p| p.name().to_string()).collect();
        (pages, names)
    }

    /// Every rank's flags, each rank a thread saying `worked(rank)`, or taking no part where
    /// `worked` says `None`.
    fn agree_all(
        names: &[String],
        worked: impl Fn(usize) -> Option<bool> + Sync,
    ) -> Vec<Option<Vec<u32>>> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..names.len())
                .map(|rank| {
                    let worked = &worked;
                    scope.spawn(move || {
                        worked(rank).map(|w| {
                            agree_through_pages(rank, w, names, Duration::from_millis(300))
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_reads_every_ranks_word_alike() {
        let (_pages, names) = pages(4);
        for flags in agree_all(&names, |_| Some(true)) {
            assert_eq!(flags.unwrap(), vec![1, 1, 1, 1]);
        }
        let (_pages, names) = pages(4);
        for flags in agree_all(&names, |rank| Some(rank != 2)) {
            assert_eq!(flags.unwrap(), vec![1, 1, 0, 1]);
        }
    }

    #[test]
    fn a_rank_that_never_settles_is_timed_out_and_a_late_one_finds_it_so() {
        let (_pages, names) = pages(3);
        let started = Instant::now();
        for flags in agree_all(&names, |rank| (rank != 1).then_some(true))
            .into_iter()
            .flatten()
        {
            assert_eq!(flags, vec![1, 0, 1]);
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        // Rank 1 comes after its peers gave up on it: its word is already settled.
        assert_eq!(
            agree_through_pages(1, true, &names, Duration::from_millis(300)),
            vec![1, 0, 1]
        );
    }

    #[test]
    fn a_page_that_cannot_be_opened_refuses_alike() {
        let (_pages, mut names) = pages(3);
        let real = names.clone();
        // Rank 0 is given a wrong name for rank 2's page; the others read the right one. Every
        // rank refuses, naming rank 0 alike.
        names[2] = "/stragglar-no-such-page".into();
        let flags: Vec<Vec<u32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let list = if rank == 0 {
                        names.clone()
                    } else {
                        real.clone()
                    };
                    scope.spawn(move || {
                        agree_through_pages(rank, true, &list, Duration::from_millis(300))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for flags in flags {
            assert_eq!(flags, vec![0, 1, 1]);
        }
    }

    #[test]
    fn a_rank_marked_failed_is_settled_failed_at_once() {
        let (pages, names) = pages(2);
        pages[1].set(7);
        let started = Instant::now();
        assert_eq!(
            agree_through_pages(0, true, &names, Duration::from_secs(20)),
            vec![1, 0]
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(pages[1].setup_verdict(), FAILED);
    }
}
