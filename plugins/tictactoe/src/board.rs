//! The tic-tac-toe board, its rules and a perfect (minimax) player.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    Empty,
    X,
    O,
}

impl Cell {
    pub fn symbol(self) -> char {
        match self {
            Cell::Empty => '.',
            Cell::X => 'X',
            Cell::O => 'O',
        }
    }

    fn other(self) -> Cell {
        match self {
            Cell::X => Cell::O,
            Cell::O => Cell::X,
            Cell::Empty => Cell::Empty,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ongoing,
    Draw,
    Win(Cell),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ongoing => f.write_str("still playing"),
            Outcome::Draw => f.write_str("draw"),
            Outcome::Win(mark) => write!(f, "{} wins", mark.symbol()),
        }
    }
}

const LINES: [[usize; 3]; 8] = [
    [0, 1, 2],
    [3, 4, 5],
    [6, 7, 8],
    [0, 3, 6],
    [1, 4, 7],
    [2, 5, 8],
    [0, 4, 8],
    [2, 4, 6],
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Board {
    cells: [Cell; 9],
    to_move: Cell,
    /// Whether the opponent opened, so the policy (player 0) plays O.
    o_is_policy: bool,
}

impl Default for Board {
    fn default() -> Self {
        Self::new()
    }
}

impl Board {
    /// An empty board, X to move.
    pub fn new() -> Self {
        Board {
            cells: [Cell::Empty; 9],
            to_move: Cell::X,
            o_is_policy: false,
        }
    }

    /// An empty board where the built-in opponent opens as X and the policy plays O.
    pub fn new_with_o_first() -> Self {
        Board {
            o_is_policy: true,
            ..Board::new()
        }
    }

    pub fn policy_plays_o(&self) -> bool {
        self.o_is_policy
    }

    pub fn to_move(&self) -> Cell {
        self.to_move
    }

    pub fn is_free(&self, cell: usize) -> bool {
        self.cells.get(cell) == Some(&Cell::Empty)
    }

    /// Free cells, 0-based.
    pub fn free_cells(&self) -> Vec<usize> {
        (0..9).filter(|&c| self.cells[c] == Cell::Empty).collect()
    }

    /// Put the mark to move on a free cell (0-based).
    pub fn play(&mut self, cell: usize) {
        debug_assert!(self.is_free(cell));
        self.cells[cell] = self.to_move;
        self.to_move = self.to_move.other();
    }

    pub fn outcome(&self) -> Outcome {
        for line in LINES {
            let mark = self.cells[line[0]];
            if mark != Cell::Empty && line.iter().all(|&c| self.cells[c] == mark) {
                return Outcome::Win(mark);
            }
        }
        if self.cells.iter().all(|&c| c != Cell::Empty) {
            Outcome::Draw
        } else {
            Outcome::Ongoing
        }
    }

    /// A best move for the mark to move (0-based), by exhaustive minimax with alpha-beta pruning;
    /// among equally good moves the first in cell order. `None` when the game is over.
    pub fn best_move(&self) -> Option<usize> {
        if self.outcome() != Outcome::Ongoing {
            return None;
        }
        let mut board = self.clone();
        let mut best = None;
        let mut best_score = i32::MIN;
        for cell in self.free_cells() {
            board.cells[cell] = self.to_move;
            board.to_move = self.to_move.other();
            let score = -board.negamax(-i32::MAX, i32::MAX);
            board.cells[cell] = Cell::Empty;
            board.to_move = self.to_move;
            if score > best_score {
                best_score = score;
                best = Some(cell);
            }
        }
        best
    }

    /// The value of the position for the mark to move: +(10 + free cells) for a win, so quicker
    /// wins score higher, 0 for a draw.
    fn negamax(&mut self, mut alpha: i32, beta: i32) -> i32 {
        match self.outcome() {
            Outcome::Win(mark) => {
                let free = self.cells.iter().filter(|&&c| c == Cell::Empty).count() as i32;
                let value = 10 + free;
                return if mark == self.to_move { value } else { -value };
            }
            Outcome::Draw => return 0,
            Outcome::Ongoing => {}
        }
        let mark = self.to_move;
        let mut best = -i32::MAX;
        for cell in 0..9 {
            if self.cells[cell] != Cell::Empty {
                continue;
            }
            self.cells[cell] = mark;
            self.to_move = mark.other();
            let score = -self.negamax(-beta, -alpha);
            self.cells[cell] = Cell::Empty;
            self.to_move = mark;
            best = best.max(score);
            alpha = alpha.max(score);
            if alpha >= beta {
                break;
            }
        }
        best
    }
}

impl fmt::Display for Board {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for row in 0..3 {
            let line: String = (0..3)
                .map(|col| match self.cells[row * 3 + col] {
                    Cell::Empty => char::from(b'1' + (row * 3 + col) as u8),
                    mark => mark.symbol(),
                })
                .collect();
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimax_blocks_and_wins() {
        let mut board = Board::new();
        // X: 0, 1 ; O: 4 ; X to move wins at 2.
        for cell in [0, 4, 1, 8] {
            board.play(cell);
        }
        assert_eq!(board.best_move(), Some(2));
        let mut board = Board::new();
        for cell in [0, 4, 1] {
            board.play(cell);
        }
        // O must block at 2.
        assert_eq!(board.best_move(), Some(2));
    }
}
