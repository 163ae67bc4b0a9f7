//! Sequences of one pass that begin alike train their common beginning once.
//!
//! An RL group is one prompt and several replies to it: its datums repeat the prompt, which is
//! often most of their tokens. A pass finds runs of neighbouring sequences (of one adapter and
//! one temperature) whose first tokens and targets agree, computes those rows once as a prefix,
//! and runs each sequence's rest as a branch that sees the prefix's keys before its own
//! ([`Span::branch`]). Every row-wise op (the projections, the adapters, the norms, the MLP, the
//! head) then runs over fewer rows, and the attention of a branch is the attention of its whole
//! sequence.
//!
//! The losses still see every sequence whole: [`SharedPrefixes::expand`] hands each sequence
//! the logprobs of the rows it shares, and [`SharedPrefixes::fold`] adds the gradients of the
//! sequences' shared rows into the one computed row (a shared row is the same function of the
//! weights for every sequence, so its gradient is the sum). So any loss, including a custom one,
//! gets what it would get without the sharing, up to the order of the float sums.
//!
//! One level of sharing: a group's rows are its longest common beginning, so groups that share
//! only a system prompt with the next group are planned as separate groups.

use opentinker_kernels::{Float, Span};

use crate::model::layers::TrainSequence;

/// The rows a pass computes for its sequences, and where each given row reads.
pub(super) struct SharedPrefixes<'a> {
    /// The sequences as computed: a group's prefix once, then each member's branch; a sequence
    /// that shares nothing as it came.
    pub sequences: Vec<TrainSequence<'a>>,
    /// The computed sequences' spans, for the attention.
    pub spans: Vec<Span>,
    /// For each row of the given sequences (one after another), the computed row it reads.
    rows: Vec<usize>,
    computed_rows: usize,
}

impl<'a> SharedPrefixes<'a> {
    /// Plans `sequences`: groups of neighbours that share a beginning, each member at most
    /// `context` tokens long (a longer one is left whole, for the model to refuse).
    pub fn plan(sequences: &[TrainSequence<'a>], context: usize) -> Self {
        let mut plan = SharedPrefixes {
            sequences: Vec::with_capacity(sequences.len()),
            spans: Vec::with_capacity(sequences.len()),
            rows: Vec::with_capacity(sequences.iter().map(|s| s.tokens.len()).sum()),
            computed_rows: 0,
        };
        let mut first = 0;
        while first < sequences.len() {
            let (members, shared) = group_at(&sequences[first..], context);
            plan.add_group(&sequences[first..first + members], shared);
            first += members;
        }
        plan
    }

    /// Whether some rows are shared (else the computed sequences are the given ones).
    pub fn shares(&self) -> bool {
        self.computed_rows < self.rows.len()
    }

    /// Each given row's value from `computed`, one per computed row.
    pub fn expand<T: Copy>(&self, computed: &[T]) -> Vec<T> {
        debug_assert_eq!(computed.len(), self.computed_rows);
        self.rows.iter().map(|&row| computed[row]).collect()
    }

    /// Each computed row's gradient: the sum of its given rows' gradients in `given`, added in
    /// the sequences' order.
    pub fn fold<T: Float>(&self, given: &[T]) -> Vec<T> {
        debug_assert_eq!(given.len(), self.rows.len());
        let mut computed = vec![T::zero(); self.computed_rows];
        for (&row, &value) in self.rows.iter().zip(given) {
            computed[row] += value;
        }
        computed
    }

    /// Adds `group`, whose members share their first `shared` rows (0: each stays whole).
    fn add_group(&mut self, group: &[TrainSequence<'a>], shared: usize) {
        if shared == 0 {
            for sequence in group {
                let rows = self.compute(*sequence, Span::whole(sequence.tokens.len()));
                self.rows.extend(rows);
            }
            return;
        }
        let leader = &group[0];
        let prefix = self.compute(
            TrainSequence {
                tokens: &leader.tokens[..shared],
                targets: &leader.targets[..shared],
                ..*leader
            },
            Span::whole(shared),
        );
        for sequence in group {
            let own = TrainSequence {
                tokens: &sequence.tokens[shared..],
                targets: &sequence.targets[shared..],
                ..*sequence
            };
            let rows = self.compute(own, Span::branch(own.tokens.len(), prefix.clone()));
            self.rows.extend(prefix.clone().chain(rows));
        }
    }

    /// Adds `sequence` to the computed ones as `span`: its computed rows.
    fn compute(&mut self, sequence: TrainSequence<'a>, span: Span) -> std::ops::Range<usize> {
        let rows = self.computed_rows..self.computed_rows + sequence.tokens.len();
        self.sequences.push(sequence);
        self.spans.push(span);
        self.computed_rows = rows.end;
        rows
    }
}

/// The group that begins `sequences`: how many neighbours it takes, and how many rows they
/// share (0: the first sequence goes alone). The second member sets the shared length; a later
/// one joins only if it shares all of it, so a group never shrinks to what its next neighbour
/// happens to share (the system prompt of the next RL group, say). Every member keeps at least
/// one row of its own.
fn group_at(sequences: &[TrainSequence<'_>], context: usize) -> (usize, usize) {
    let leader = &sequences[0];
    if !shareable(leader, context) {
        return (1, 0);
    }
    let mut shared = 0;
    let mut members = 1;
    for sequence in &sequences[1..] {
        if !shareable(sequence, context)
            || sequence.adapter != leader.adapter
            || sequence.temperature != leader.temperature
        {
            break;
        }
        let common = common_rows(leader, sequence);
        if members == 1 {
            shared = common;
        } else if common < shared {
            break;
        }
        if shared == 0 {
            break;
        }
        members += 1;
    }
    if members == 1 {
        return (1, 0);
    }
    let shortest = sequences[..members]
        .iter()
        .map(|s| s.tokens.len())
        .min()
        .unwrap_or(0);
    (members, shared.min(shortest.saturating_sub(1)))
}

/// Whether `sequence` can be part of a group: a target per token, within the context.
fn shareable(sequence: &TrainSequence<'_>, context: usize) -> bool {
    sequence.targets.len() == sequence.tokens.len() && sequence.tokens.len() <= context
}

/// How many first rows `a` and `b` share: the same token and the same target at each.
fn common_rows(a: &TrainSequence<'_>, b: &TrainSequence<'_>) -> usize {
    a.tokens
        .iter()
        .zip(a.targets)
        .zip(b.tokens.iter().zip(b.targets))
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence<'a>(tokens: &'a [u32], targets: &'a [u32]) -> TrainSequence<'a> {
        TrainSequence {
            tokens,
            targets,
            adapter: Some(0),
            temperature: 1.0,
        }
    }

    #[test]
    fn a_group_shares_its_common_beginning_and_each_member_keeps_a_row() {
        let (a, b, c) = ([1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3]);
        let (ta, tb, tc) = ([2, 3, 4, 5, 0], [2, 3, 9, 0], [2, 3, 0]);
        let given = [sequence(&a, &ta), sequence(&b, &tb), sequence(&c, &tc)];
        let plan = SharedPrefixes::plan(&given, 100);
        // a and b agree on two rows (their third targets differ); c's last row stays its own.
        assert!(plan.shares());
        assert_eq!(
            plan.spans,
            vec![
                Span::whole(2),
                Span::branch(3, 0..2),
                Span::branch(2, 0..2),
                Span::branch(1, 0..2)
            ]
        );
        assert_eq!(plan.sequences[1].tokens, &[3, 4, 5]);
        let computed: Vec<u32> = (0..8).collect();
        assert_eq!(
            plan.expand(&computed),
            vec![0, 1, 2, 3, 4, 0, 1, 5, 6, 0, 1, 7]
        );
        let folded = plan.fold(&[1.0f64; 12]);
        assert_eq!(folded, vec![3.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn a_later_neighbour_that_shares_less_starts_a_group_of_its_own() {
        let prompt = [7, 7, 7, 1, 1, 1];
        let other = [7, 7, 7, 2, 2, 2];
        let targets = [0; 6];
        let given = [
            sequence(&prompt, &targets),
            sequence(&prompt, &targets),
            sequence(&other, &targets),
            sequence(&other, &targets),
        ];
        let plan = SharedPrefixes::plan(&given, 100);
        assert_eq!(
            plan.spans,
            vec![
                Span::whole(5),
                Span::branch(1, 0..5),
                Span::branch(1, 0..5),
                Span::whole(5),
                Span::branch(1, 7..12),
                Span::branch(1, 7..12),
            ]
        );
    }

    #[test]
    fn other_adapters_temperatures_and_bad_sequences_are_left_whole() {
        let tokens = [1, 2, 3, 4];
        let mut second = sequence(&tokens, &tokens);
        second.adapter = Some(1);
        let given = [sequence(&tokens, &tokens), second];
        assert!(!SharedPrefixes::plan(&given, 100).shares());
        let mut second = sequence(&tokens, &tokens);
        second.temperature = 0.7;
        assert!(!SharedPrefixes::plan(&[sequence(&tokens, &tokens), second], 100).shares());
        // Past the context, or a target short: the model refuses them, whole.
        let pair = [sequence(&tokens, &tokens), sequence(&tokens, &tokens)];
        assert!(!SharedPrefixes::plan(&pair, 3).shares());
        let short = [sequence(&tokens, &tokens[..3]), sequence(&tokens, &tokens)];
        let plan = SharedPrefixes::plan(&short, 100);
        assert!(!plan.shares());
        assert_eq!(plan.sequences[0].targets.len(), 3);
    }
}
