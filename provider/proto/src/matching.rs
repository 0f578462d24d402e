//! Matching arriving messages with posted receives, in order.
//!
//! Two lanes, untagged and tagged, each with a queue of posted receives (in
//! post order) and a queue of unexpected messages (in arrival order). A
//! message takes the first posted receive of its lane that accepts its
//! source and tag; a new receive takes the first unexpected message it
//! accepts. A multi-receive buffer stays posted while it has room, handing
//! out consecutive pieces, and is retired once less than the minimum is left;
//! its release is reported with the last data completion that used it.

use std::collections::VecDeque;

use super::wire::MatchInfo;

pub use crate::iov::Iov;

/// The pieces of one buffer. Nearly every buffer is one piece, kept inline:
/// a send or receive must not allocate for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IovList {
    One(Iov),
    Many(Vec<Iov>),
}

impl std::ops::Deref for IovList {
    type Target = [Iov];

    fn deref(&self) -> &[Iov] {
        match self {
            IovList::One(piece) => std::slice::from_ref(piece),
            IovList::Many(pieces) => pieces,
        }
    }
}

impl std::ops::DerefMut for IovList {
    fn deref_mut(&mut self) -> &mut [Iov] {
        match self {
            IovList::One(piece) => std::slice::from_mut(piece),
            IovList::Many(pieces) => pieces,
        }
    }
}

impl From<Vec<Iov>> for IovList {
    fn from(pieces: Vec<Iov>) -> Self {
        match pieces[..] {
            [piece] => IovList::One(piece),
            _ => IovList::Many(pieces),
        }
    }
}

/// A receive posted by the application.
#[derive(Clone, Debug)]
pub struct PostedRecv<A> {
    pub context: usize,
    pub iov: IovList,
    /// `None` accepts any source.
    pub src: Option<A>,
    pub tag: u64,
    pub ignore: u64,
    /// Report a completion (selective completion may turn it off).
    pub completion: bool,
    pub multi_recv: bool,
}

impl<A: Copy + Eq> PostedRecv<A> {
    fn accepts(&self, src: &A, tag: Option<u64>) -> bool {
        self.src.is_none_or(|want| want == *src)
            && tag.is_none_or(|tag| (tag | self.ignore) == (self.tag | self.ignore))
    }

    pub fn capacity(&self) -> usize {
        self.iov.iter().map(|&(_, len)| len).sum()
    }
}

/// Where the matched message's data goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub context: usize,
    pub iov: IovList,
    pub completion: bool,
    /// The multi-receive buffer this piece belongs to, if any.
    pub multi: Option<MultiId>,
}

impl Placement {
    /// Where a whole posted receive (not a multi-receive piece) takes a
    /// message.
    #[inline(always)]
    fn whole<A>(recv: PostedRecv<A>) -> Placement {
        Placement {
            context: recv.context,
            iov: recv.iov,
            completion: recv.completion,
            multi: None,
        }
    }

    #[inline]
    pub fn capacity(&self) -> usize {
        crate::iov::total_len(&self.iov)
    }

    /// Start of the data, as reported in the completion's `buf`.
    #[inline]
    pub fn buf(&self) -> usize {
        match &self.iov {
            IovList::One((addr, _)) => *addr,
            IovList::Many(pieces) => pieces.first().map_or(0, |&(addr, _)| addr),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MultiId(u64);

/// A multi-receive buffer being consumed.
#[derive(Debug)]
struct MultiState {
    id: MultiId,
    context: usize,
    completion: bool,
    /// Pieces handed out whose data completion has not been reported yet.
    outstanding: usize,
    retired: bool,
}

/// A receive `fi_cancel` removed.
#[derive(Debug)]
pub struct Cancelled<A> {
    pub tagged: bool,
    pub recv: PostedRecv<A>,
    /// A multi-receive buffer released by the cancel itself (no piece of it
    /// in flight): its cancel entry carries FI_MULTI_RECV.
    pub released: bool,
}

/// What a finished piece of a multi-receive buffer means for its buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum MultiDone {
    /// The buffer is still in use.
    InUse,
    /// That was the last piece of a retired buffer: report the release.
    Released,
}

/// A message that arrived before any receive accepted it.
#[derive(Debug)]
pub struct Unexpected<A, B> {
    pub src: A,
    pub info: MatchInfo,
    pub len: usize,
    pub body: B,
    /// Context of the `FI_PEEK | FI_CLAIM` that reserved it.
    pub claimed_by: Option<usize>,
}

#[derive(Debug)]
struct Lane<A, B> {
    posted: VecDeque<PostedRecv<A>>,
    unexpected: VecDeque<Unexpected<A, B>>,
}

impl<A, B> Default for Lane<A, B> {
    fn default() -> Self {
        Lane {
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
        }
    }
}

/// The matching engine of one endpoint. `A` is a peer address, `B` what an
/// unexpected message keeps (its data or its rendezvous request).
#[derive(Debug)]
pub struct Matcher<A, B> {
    untagged: Lane<A, B>,
    tagged: Lane<A, B>,
    multi: Vec<MultiState>,
    next_multi: u64,
    min_multi_recv: usize,
}

impl<A: Copy + Eq, B> Matcher<A, B> {
    pub fn new(min_multi_recv: usize) -> Self {
        Matcher {
            untagged: Lane::default(),
            tagged: Lane::default(),
            multi: Vec::new(),
            next_multi: 0,
            min_multi_recv,
        }
    }

    pub fn min_multi_recv(&self) -> usize {
        self.min_multi_recv
    }

    pub fn set_min_multi_recv(&mut self, min: usize) {
        self.min_multi_recv = min;
    }

    fn lane(&mut self, tagged: bool) -> &mut Lane<A, B> {
        if tagged {
            &mut self.tagged
        } else {
            &mut self.untagged
        }
    }

    /// Finds the receive for a message that just arrived, or `None` if the
    /// caller must queue it as unexpected. The oldest receive taking it
    /// whole is inlined where messages arrive; a search or a piece of a
    /// multi-receive buffer is not.
    #[inline(always)]
    pub fn match_arrival(&mut self, src: &A, info: &MatchInfo, len: usize) -> Option<Placement> {
        let lane = self.lane(info.tag.is_some());
        // Mostly the oldest receive takes it, whole: looked at before a search.
        let oldest = lane.posted.front()?;
        if !oldest.multi_recv && oldest.accepts(src, info.tag) {
            let recv = lane.posted.pop_front().expect("looked at above");
            return Some(Placement::whole(recv));
        }
        self.match_search(src, info, len)
    }

    /// [`Self::match_arrival`] past the oldest receive, or into a piece of
    /// a multi-receive buffer.
    #[inline(never)]
    fn match_search(&mut self, src: &A, info: &MatchInfo, len: usize) -> Option<Placement> {
        let min_multi = self.min_multi_recv;
        let lane = self.lane(info.tag.is_some());
        let index = lane.posted.iter().position(|r| r.accepts(src, info.tag))?;
        if !lane.posted[index].multi_recv {
            let recv = lane.posted.remove(index).expect("index is in range");
            return Some(Placement::whole(recv));
        }
        // A piece of a multi-receive buffer: its single iov shrinks from the
        // front.
        let recv = &mut lane.posted[index];
        let (addr, room) = recv.iov[0];
        let take = len.min(room);
        recv.iov[0] = (addr + take, room - take);
        // Retired below the minimum, and always once full (a minimum of 0
        // must not leave an empty buffer posted to truncate every message).
        let left = room - take;
        let retire = left == 0 || left < min_multi;
        let context = recv.context;
        let completion = recv.completion;
        if retire {
            lane.posted.remove(index);
        }
        let id = self.multi_for(context, completion);
        let state = self
            .multi
            .iter_mut()
            .find(|m| m.id == id)
            .expect("just found");
        state.outstanding += 1;
        state.retired |= retire;
        Some(Placement {
            context,
            iov: IovList::One((addr, take)),
            completion,
            multi: Some(id),
        })
    }

    fn multi_for(&mut self, context: usize, completion: bool) -> MultiId {
        if let Some(state) = self
            .multi
            .iter()
            .find(|m| m.context == context && !m.retired)
        {
            return state.id;
        }
        let id = MultiId(self.next_multi);
        self.next_multi += 1;
        self.multi.push(MultiState {
            id,
            context,
            completion,
            outstanding: 0,
            retired: false,
        });
        id
    }

    /// Records that the data completion of a multi-receive piece is being
    /// reported; says whether it also releases the buffer.
    pub fn multi_piece_done(&mut self, id: MultiId) -> MultiDone {
        let Some(index) = self.multi.iter().position(|m| m.id == id) else {
            return MultiDone::InUse;
        };
        let state = &mut self.multi[index];
        state.outstanding -= 1;
        if state.retired && state.outstanding == 0 {
            self.multi.swap_remove(index);
            MultiDone::Released
        } else {
            MultiDone::InUse
        }
    }

    /// Queues a message no receive accepted.
    pub fn push_unexpected(&mut self, message: Unexpected<A, B>) {
        self.lane(message.info.tag.is_some())
            .unexpected
            .push_back(message);
    }

    /// Finds the first unexpected message `recv` accepts. Claimed messages
    /// are skipped unless `claimed_by` names their claimer.
    fn find_unexpected(
        &mut self,
        tagged: bool,
        recv: &PostedRecv<A>,
        claimed_by: Option<usize>,
    ) -> Option<usize> {
        let takes =
            |u: &Unexpected<A, B>| u.claimed_by == claimed_by && recv.accepts(&u.src, u.info.tag);
        let unexpected = &self.lane(tagged).unexpected;
        // Mostly none, or the oldest: looked at before a search.
        if takes(unexpected.front()?) {
            return Some(0);
        }
        unexpected.iter().position(takes)
    }

    /// A new receive: takes the first unexpected message it accepts, or is
    /// posted. A multi-receive buffer may take several at once: the caller
    /// calls again while it returns `Some` and the buffer stays posted
    /// ([`Self::repost_multi`]).
    #[inline]
    pub fn post(
        &mut self,
        tagged: bool,
        recv: PostedRecv<A>,
    ) -> Option<(Placement, Unexpected<A, B>)> {
        let lane = self.lane(tagged);
        // Mostly nothing is waiting: no search.
        if lane.unexpected.is_empty() {
            lane.posted.push_back(recv);
            return None;
        }
        self.post_searching(tagged, recv)
    }

    /// [`Self::post`] with unexpected messages waiting in the lane.
    #[inline(never)]
    fn post_searching(
        &mut self,
        tagged: bool,
        recv: PostedRecv<A>,
    ) -> Option<(Placement, Unexpected<A, B>)> {
        let Some(index) = self.find_unexpected(tagged, &recv, None) else {
            self.lane(tagged).posted.push_back(recv);
            return None;
        };
        let unexpected = &mut self.lane(tagged).unexpected;
        let message = if index == 0 {
            unexpected.pop_front()
        } else {
            unexpected.remove(index)
        }
        .expect("index is in range");
        if !recv.multi_recv {
            let placement = Placement {
                context: recv.context,
                iov: recv.iov,
                completion: recv.completion,
                multi: None,
            };
            return Some((placement, message));
        }
        // Post the buffer, then let the message match it as if it had just
        // arrived: the same carving and retiring rules apply.
        self.lane(tagged).posted.push_back(recv);
        let placement = self
            .match_arrival(&message.src, &message.info, message.len)
            .expect("the buffer accepts the message it was matched with");
        Some((placement, message))
    }

    /// For a multi-receive buffer still posted after [`Self::post`]: the
    /// next unexpected message it takes, if any.
    pub fn repost_multi(&mut self, context: usize) -> Option<(Placement, Unexpected<A, B>)> {
        let lane = &self.untagged;
        let recv = lane
            .posted
            .iter()
            .find(|r| r.multi_recv && r.context == context)?
            .clone();
        let index = self.find_unexpected(false, &recv, None)?;
        let message = self
            .untagged
            .unexpected
            .remove(index)
            .expect("index is in range");
        let placement = self
            .match_arrival(&message.src, &message.info, message.len)
            .expect("the buffer accepts the message");
        Some((placement, message))
    }

    /// `FI_PEEK`: the first unexpected message `recv` accepts, left queued;
    /// with `claim`, reserved for a later `FI_CLAIM` receive with the same
    /// context.
    pub fn peek(
        &mut self,
        tagged: bool,
        recv: &PostedRecv<A>,
        claim: bool,
    ) -> Option<&Unexpected<A, B>> {
        let index = self.find_unexpected(tagged, recv, None)?;
        let message = &mut self.lane(tagged).unexpected[index];
        if claim {
            message.claimed_by = Some(recv.context);
        }
        Some(message)
    }

    /// `FI_CLAIM`: takes the message an earlier peek reserved for `context`.
    pub fn take_claimed(&mut self, tagged: bool, context: usize) -> Option<Unexpected<A, B>> {
        let lane = self.lane(tagged);
        let index = lane
            .unexpected
            .iter()
            .position(|u| u.claimed_by == Some(context))?;
        lane.unexpected.remove(index)
    }

    /// `fi_cancel`: removes the posted receive with this context.
    pub fn cancel(&mut self, context: usize) -> Option<Cancelled<A>> {
        for tagged in [false, true] {
            let lane = self.lane(tagged);
            if let Some(index) = lane.posted.iter().position(|r| r.context == context) {
                let recv = lane.posted.remove(index)?;
                // A cancelled multi-receive buffer is released now, unless
                // pieces handed out are still in flight: then the last of
                // them releases it (the provider touches it until then).
                // (A retired buffer of the same context is an earlier one.)
                let in_use = self
                    .multi
                    .iter()
                    .any(|m| m.context == context && !m.retired && m.outstanding > 0);
                self.multi
                    .retain(|m| m.context != context || m.outstanding > 0);
                for m in self.multi.iter_mut().filter(|m| m.context == context) {
                    m.retired = true;
                }
                return Some(Cancelled {
                    tagged,
                    released: recv.multi_recv && !in_use,
                    recv,
                });
            }
        }
        None
    }

    /// Removes the receives posted for messages from `src` only (a dead
    /// peer's), or with `None` those from any source: `(tagged, receive)`
    /// in post order. Multi-receive buffers stay.
    pub fn remove_posted_from(&mut self, src: Option<&A>) -> Vec<(bool, PostedRecv<A>)> {
        let mut removed = Vec::new();
        for tagged in [false, true] {
            let lane = self.lane(tagged);
            let (from_src, rest): (VecDeque<_>, VecDeque<_>) = lane
                .posted
                .drain(..)
                .partition(|r| !r.multi_recv && r.src.as_ref() == src);
            lane.posted = rest;
            removed.extend(from_src.into_iter().map(|r| (tagged, r)));
        }
        removed
    }

    /// Whether a receive from any source is posted (multi-receive buffers
    /// apart); walks the queues.
    pub fn posted_from_anyone(&self) -> bool {
        [&self.untagged, &self.tagged]
            .iter()
            .any(|lane| lane.posted.iter().any(|r| !r.multi_recv && r.src.is_none()))
    }

    /// Whether a multi-receive buffer's completions are wanted.
    pub fn multi_completion(&self, id: MultiId) -> bool {
        self.multi
            .iter()
            .find(|m| m.id == id)
            .is_none_or(|m| m.completion)
    }

    pub fn posted_len(&self) -> usize {
        self.untagged.posted.len() + self.tagged.posted.len()
    }

    pub fn unexpected_len(&self) -> usize {
        self.untagged.unexpected.len() + self.tagged.unexpected.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type M = Matcher<u32, &'static str>;

    fn recv(context: usize, src: Option<u32>, tag: u64, ignore: u64) -> PostedRecv<u32> {
        PostedRecv {
            context,
            iov: IovList::One((0x1000 * context, 100)),
            src,
            tag,
            ignore,
            completion: true,
            multi_recv: false,
        }
    }

    fn tagged(tag: u64) -> MatchInfo {
        MatchInfo {
            tag: Some(tag),
            data: None,
        }
    }

    fn unexpected(src: u32, info: MatchInfo, body: &'static str) -> Unexpected<u32, &'static str> {
        Unexpected {
            src,
            info,
            len: 10,
            body,
            claimed_by: None,
        }
    }

    #[test]
    fn tags_sources_and_lanes() {
        let mut m = M::new(0);
        assert!(m.post(true, recv(1, Some(7), 0x10, 0x0f)).is_none());
        assert!(m.post(true, recv(2, None, 0x20, 0)).is_none());
        assert!(m.post(false, recv(3, None, 0, 0)).is_none());
        // Untagged messages never match tagged receives, and the reverse.
        assert_eq!(
            m.match_arrival(&1, &MatchInfo::default(), 5)
                .unwrap()
                .context,
            3
        );
        // Wrong source for receive 1; the ignore mask covers the low nibble.
        assert!(m.match_arrival(&8, &tagged(0x1f), 5).is_none());
        assert_eq!(m.match_arrival(&7, &tagged(0x1f), 5).unwrap().context, 1);
        assert!(m.match_arrival(&7, &tagged(0x21), 5).is_none());
        assert_eq!(m.match_arrival(&9, &tagged(0x20), 5).unwrap().context, 2);
        assert_eq!(m.posted_len(), 0);
    }

    #[test]
    fn posted_order_wins() {
        let mut m = M::new(0);
        m.post(true, recv(1, None, 0, u64::MAX));
        m.post(true, recv(2, None, 5, 0));
        assert_eq!(m.match_arrival(&1, &tagged(5), 1).unwrap().context, 1);
        assert_eq!(m.match_arrival(&1, &tagged(5), 1).unwrap().context, 2);
    }

    #[test]
    fn unexpected_in_arrival_order() {
        let mut m = M::new(0);
        m.push_unexpected(unexpected(1, tagged(5), "first"));
        m.push_unexpected(unexpected(2, tagged(6), "second"));
        m.push_unexpected(unexpected(1, tagged(5), "third"));
        let (p, u) = m.post(true, recv(1, None, 6, 0)).unwrap();
        assert_eq!((p.context, u.body), (1, "second"));
        let (_, u) = m.post(true, recv(2, Some(1), 5, 0)).unwrap();
        assert_eq!(u.body, "first");
        let (_, u) = m.post(true, recv(3, None, 0, u64::MAX)).unwrap();
        assert_eq!(u.body, "third");
        assert_eq!(m.unexpected_len(), 0);
    }

    #[test]
    fn peek_claim_and_discard() {
        let mut m = M::new(0);
        m.push_unexpected(unexpected(1, tagged(5), "a"));
        m.push_unexpected(unexpected(1, tagged(5), "b"));
        let probe = recv(42, None, 5, 0);
        assert_eq!(m.peek(true, &probe, false).unwrap().body, "a");
        assert_eq!(m.peek(true, &probe, true).unwrap().body, "a");
        // Claimed: invisible to other receives and peeks.
        assert_eq!(m.peek(true, &probe, false).unwrap().body, "b");
        let (_, u) = m.post(true, recv(7, None, 5, 0)).unwrap();
        assert_eq!(u.body, "b");
        assert!(m.post(true, recv(8, None, 5, 0)).is_none());
        assert_eq!(m.take_claimed(true, 42).unwrap().body, "a");
        assert!(m.take_claimed(true, 42).is_none());
    }

    #[test]
    fn cancel_removes_posted() {
        let mut m = M::new(0);
        m.post(true, recv(1, None, 5, 0));
        let cancelled = m.cancel(1).unwrap();
        assert!(cancelled.tagged && !cancelled.released);
        assert_eq!(cancelled.recv.context, 1);
        assert!(m.cancel(1).is_none());
        assert!(m.match_arrival(&1, &tagged(5), 1).is_none());
    }

    fn multi(context: usize, len: usize) -> PostedRecv<u32> {
        PostedRecv {
            context,
            iov: IovList::One((0x10000, len)),
            src: None,
            tag: 0,
            ignore: 0,
            completion: true,
            multi_recv: true,
        }
    }

    #[test]
    fn multi_recv_fills_in_order_and_releases_after_last_piece() {
        let mut m = M::new(100);
        m.post(false, multi(1, 1000));
        m.post(false, multi(2, 1000));
        let any = MatchInfo::default();
        let a = m.match_arrival(&1, &any, 400).unwrap();
        let b = m.match_arrival(&1, &any, 450).unwrap();
        assert_eq!(a.iov[..], [(0x10000, 400)]);
        assert_eq!(b.iov[..], [(0x10000 + 400, 450)]);
        // 150 left: still at least the minimum, so the buffer stays posted.
        let c = m.match_arrival(&1, &any, 120).unwrap();
        assert_eq!((c.context, &c.iov[..]), (1, &[(0x10000 + 850, 120)][..]));
        // 30 left < 100: retired; the next message goes to buffer 2.
        assert_eq!(m.match_arrival(&1, &any, 10).unwrap().context, 2);
        let id = a.multi.unwrap();
        assert_eq!(b.multi, Some(id));
        assert_eq!(m.multi_piece_done(id), MultiDone::InUse);
        assert_eq!(m.multi_piece_done(id), MultiDone::InUse);
        assert_eq!(m.multi_piece_done(id), MultiDone::Released);
    }

    #[test]
    fn cancelling_a_multi_recv_buffer_in_use_releases_it_with_its_last_piece() {
        let mut m = M::new(10);
        m.post(false, multi(1, 1000));
        let p = m.match_arrival(&1, &MatchInfo::default(), 100).unwrap();
        let cancelled = m.cancel(1).unwrap();
        assert!(!cancelled.released, "a piece is still in flight");
        assert_eq!(m.multi_piece_done(p.multi.unwrap()), MultiDone::Released);
        // Nothing in flight: the cancel itself releases it.
        m.post(false, multi(2, 1000));
        assert!(m.cancel(2).unwrap().released);
    }

    #[test]
    fn a_full_multi_recv_buffer_retires_even_with_a_zero_minimum() {
        let mut m = M::new(0);
        m.post(false, multi(1, 100));
        m.post(false, multi(2, 100));
        let any = MatchInfo::default();
        let a = m.match_arrival(&1, &any, 60).unwrap();
        let b = m.match_arrival(&1, &any, 40).unwrap();
        assert_eq!((a.context, b.context), (1, 1));
        // Buffer 1 is full: the next message goes whole to buffer 2.
        let c = m.match_arrival(&1, &any, 30).unwrap();
        assert_eq!((c.context, &c.iov[..]), (2, &[(0x10000, 30)][..]));
        let id = a.multi.unwrap();
        assert_eq!(m.multi_piece_done(id), MultiDone::InUse);
        assert_eq!(m.multi_piece_done(id), MultiDone::Released);
    }

    #[test]
    fn multi_recv_truncates_to_room() {
        let mut m = M::new(10);
        m.post(false, multi(1, 100));
        let p = m.match_arrival(&1, &MatchInfo::default(), 500).unwrap();
        assert_eq!(p.iov[..], [(0x10000, 100)]);
        assert_eq!(m.multi_piece_done(p.multi.unwrap()), MultiDone::Released);
    }

    #[test]
    fn multi_recv_takes_waiting_unexpected_messages() {
        let mut m = M::new(10);
        for body in ["x", "y", "z"] {
            m.push_unexpected(unexpected(1, MatchInfo::default(), body));
        }
        let (p, u) = m.post(false, multi(1, 25)).unwrap();
        assert_eq!((u.body, &p.iov[..]), ("x", &[(0x10000, 10)][..]));
        let (p2, u2) = m.repost_multi(1).unwrap();
        assert_eq!((u2.body, &p2.iov[..]), ("y", &[(0x10000 + 10, 10)][..]));
        // 5 left < 10: retired, so "z" waits for another buffer.
        assert!(m.repost_multi(1).is_none());
        assert_eq!(m.unexpected_len(), 1);
    }
}
