package job

import "fmt"

// fitNodeList raises the job's node count to its --nodelist's, as slurmctld raises a
// job's minimum node count to the nodes it requires (sbatch(1), -w: "the job will
// contain all of these hosts").
func (s *Spec) fitNodeList() {
	if n := len(s.NodeList); n > s.MinNodes {
		s.MinNodes = n
		s.MaxNodes = max(s.MaxNodes, n)
	}
}

// checkNodeChoice refuses what gangrun cannot honour of a job's --exclusive,
// --constraint, --nodelist and --exclude (allocator.NodeChoice.Validate), and a
// --nodelist with more --nodes (or --spare-nodes) than it names: gangrun places such a
// job on the listed nodes alone, where Slurm adds others.
func (s Spec) checkNodeChoice() error {
	if err := s.NodeChoice.Validate(); err != nil {
		return err
	}
	if n := len(s.NodeList); n > 0 && s.MinNodes+s.SpareNodes > n {
		return fmt.Errorf("--nodes %d (with --spare-nodes %d) and a --nodelist of %d: gangrun places a --nodelist job on the listed nodes alone; list them all", s.MinNodes, s.SpareNodes, n)
	}
	return nil
}
