package features

import (
	"bytes"
	"strings"
)

// Feature flags, carried comma-separated in Llm-Features and matched by
// cascade rules (aliases.*.cascade[].when.features).
const (
	FeatureCode = "code"
)

// codeLines is how many code-looking lines make a prompt "code" when it has
// no fenced block: one line of prose can look like code, three rarely do.
const codeLines = 3

// Flags returns the Llm-Features value of a canonical prompt ("" when no
// flag is set).
func Flags(prompt []byte) string {
	if IsCode(prompt) {
		return FeatureCode
	}
	return ""
}

// AppendFlags appends the flags of prompt to dst, for callers that build the
// list themselves.
func AppendFlags(dst []string, prompt []byte) []string {
	if IsCode(prompt) {
		dst = append(dst, FeatureCode)
	}
	return dst
}

// IsCode is a cheap heuristic: a fenced ``` block, or at least codeLines
// lines that start with a keyword of a common language or a closing "}", end
// the way code lines do (";", "{"), or hold an arrow "=>". It allocates
// nothing and reads a long prompt at memory speed: the fence and the arrows
// are searched across the whole prompt, not line by line, and a line is only
// compared with the keywords its first byte could begin.
func IsCode(prompt []byte) bool {
	if bytes.Contains(prompt, []byte("```")) {
		return true
	}
	n := 0
	arrow := bytes.Index(prompt, []byte("=>")) // the next arrow at or after the line, -1: none left
	for start := 0; start < len(prompt); {
		end := len(prompt)
		if i := bytes.IndexByte(prompt[start:], '\n'); i >= 0 {
			end = start + i
		}
		if arrow >= 0 && arrow < start {
			if i := bytes.Index(prompt[start:], []byte("=>")); i >= 0 {
				arrow = start + i
			} else {
				arrow = -1
			}
		}
		// Blanks are never part of an arrow, so an arrow within the line is
		// within its trimmed text.
		if codeLine(prompt[start:end], arrow >= 0 && arrow+2 <= end) {
			if n++; n >= codeLines {
				return true
			}
		}
		start = end + 1
	}
	return false
}

// codeStarts are the keywords a code line may begin with; codeFirstBytes
// their first bytes.
var codeStarts = [...]string{
	"def ", "func ", "class ", "#include", "import ", "package ", "fn ",
	"public ", "private ", "const ", "let ", "var ", "return ", "if (", "for (",
	"while (", "#!/", "SELECT ", "select ",
}

const codeFirstBytes = "dfc#iplvrwSs"

func codeLine(line []byte, hasArrow bool) bool {
	for len(line) > 0 {
		if c := line[len(line)-1]; c != ' ' && c != '\t' && c != '\r' {
			break
		}
		line = line[:len(line)-1]
	}
	t := line
	for len(t) > 0 && (t[0] == ' ' || t[0] == '\t') {
		t = t[1:]
	}
	if len(t) == 0 {
		return false
	}
	if last := t[len(t)-1]; last == ';' || last == '{' || t[0] == '}' || hasArrow {
		return true
	}
	if strings.IndexByte(codeFirstBytes, t[0]) < 0 {
		return false
	}
	for _, s := range codeStarts {
		if len(t) >= len(s) && string(t[:len(s)]) == s {
			return true
		}
	}
	return false
}
