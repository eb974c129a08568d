package job

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/quote"
)

// --begin (sbatch -b, scontrol update StartTime=): the job waits PENDING with reason
// BeginTime, without a request, until then (the controller's deferred pass). The forms
// are Slurm's parse_time's (src/common/parse_time.c), in local time:
//
//	now[+COUNT[seconds|minutes|hours|days|weeks]]   seconds by default; any prefix of the unit
//	HH:MM[:SS] [AM|PM]                              today, or tomorrow once past
//	midnight, noon, elevenses, fika, teatime        00:00, 12:00, 11:00, 15:00, 16:00, the next one
//	today, tomorrow                                 00:00 of that day
//	YYYY-MM-DD[THH:MM[:SS]]
//	MM/DD[/YY], MMDD[YY]                            00:00 of that day
//
// A time in the past is now: the job does not wait.

// namedTimes are parse_time's times of day by name, in hours.
var namedTimes = map[string]int{"midnight": 0, "noon": 12, "elevenses": 11, "fika": 15, "teatime": 16}

// ParseBegin parses --begin's value v at now: the time the job may start. Errors name
// v, in the words of Slurm's "Invalid time specification".
func ParseBegin(v string, now time.Time) (time.Time, error) {
	bad := fmt.Errorf("--begin %s: Invalid time specification (want now+COUNT[units], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], midnight, noon, teatime, today or tomorrow)", quote.Q(v))
	s := strings.ToLower(strings.TrimSpace(v))
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, now.Location())
	switch {
	case s == "":
		return time.Time{}, bad
	case strings.HasPrefix(s, "now"):
		d, err := beginDelta(s[3:])
		if err != nil {
			return time.Time{}, bad
		}
		return now.Add(d), nil
	case s == "today":
		return day, nil
	case s == "tomorrow":
		return day.AddDate(0, 0, 1), nil
	}
	if h, ok := namedTimes[s]; ok {
		return nextAt(now, day.Add(time.Duration(h)*time.Hour)), nil
	}
	if t, ok := clockToday(s, day); ok {
		return nextAt(now, t), nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02", "01/02/06", "010206"} {
		if t, err := time.ParseInLocation(layout, strings.Replace(s, "t", "T", 1), now.Location()); err == nil {
			return t, nil
		}
	}
	for _, layout := range []string{"01/02", "0102"} {
		if t, err := time.ParseInLocation(layout, s, now.Location()); err == nil {
			t = t.AddDate(now.Year(), 0, 0)
			if t.Before(day) {
				t = t.AddDate(1, 0, 0) // parse_time: a date past this year is next year's
			}
			return t, nil
		}
	}
	return time.Time{}, bad
}

// nextAt is t, or a day later when t is already past at now.
func nextAt(now, t time.Time) time.Time {
	if t.Before(now) {
		return t.AddDate(0, 0, 1)
	}
	return t
}

// clockToday reads "HH:MM[:SS][ ]{am|pm}" as that time of day.
func clockToday(s string, day time.Time) (time.Time, bool) {
	s = strings.TrimSpace(s)
	half := 0
	switch {
	case strings.HasSuffix(s, "am"):
		s, half = strings.TrimSpace(strings.TrimSuffix(s, "am")), 1
	case strings.HasSuffix(s, "pm"):
		s, half = strings.TrimSpace(strings.TrimSuffix(s, "pm")), 2
	}
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return time.Time{}, false
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || len(p) > 2 {
			return time.Time{}, false
		}
		n[i] = v
	}
	h, m, sec := n[0], n[1], n[2]
	switch {
	case half != 0 && (h < 1 || h > 12):
		return time.Time{}, false
	case half == 1 && h == 12:
		h = 0
	case half == 2 && h < 12:
		h += 12
	}
	if h > 23 || m > 59 || sec > 59 {
		return time.Time{}, false
	}
	return day.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec)*time.Second), true
}

// beginDelta reads now's "+COUNT[unit]" ("" is none).
func beginDelta(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if s[0] != '+' {
		return 0, fmt.Errorf("want +COUNT")
	}
	s = s[1:]
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	n, err := strconv.Atoi(s[:i])
	if err != nil || n > int(MaxTime/time.Second) {
		return 0, fmt.Errorf("want a count")
	}
	unit := time.Second
	switch u := s[i:]; {
	case u == "" || strings.HasPrefix("seconds", u):
	case strings.HasPrefix("minutes", u):
		unit = time.Minute
	case strings.HasPrefix("hours", u):
		unit = time.Hour
	case strings.HasPrefix("days", u):
		unit = 24 * time.Hour
	case strings.HasPrefix("weeks", u):
		unit = 7 * 24 * time.Hour
	default:
		return 0, fmt.Errorf("unit %q", u)
	}
	return time.Duration(n) * unit, nil
}
