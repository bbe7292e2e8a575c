package features

import "bytes"

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
// the way code lines do (";", "{"), or hold an arrow "=>". It reads the prompt once and
// allocates nothing; a wrong guess only costs a cheaper or dearer model.
func IsCode(prompt []byte) bool {
	if bytes.Contains(prompt, []byte("```")) {
		return true
	}
	n := 0
	for len(prompt) > 0 {
		line := prompt
		if i := bytes.IndexByte(prompt, '\n'); i >= 0 {
			line, prompt = prompt[:i], prompt[i+1:]
		} else {
			prompt = nil
		}
		if codeLine(line) {
			if n++; n >= codeLines {
				return true
			}
		}
	}
	return false
}

var codeStarts = [...]string{
	"def ", "func ", "class ", "#include", "import ", "package ", "fn ",
	"public ", "private ", "const ", "let ", "var ", "return ", "if (", "for (",
	"while (", "#!/", "SELECT ", "select ",
}

func codeLine(line []byte) bool {
	line = bytes.TrimRight(line, " \t\r")
	t := bytes.TrimLeft(line, " \t")
	if len(t) == 0 {
		return false
	}
	if last := t[len(t)-1]; last == ';' || last == '{' || t[0] == '}' {
		return true
	}
	if bytes.Contains(t, []byte("=>")) {
		return true
	}
	for _, s := range codeStarts {
		if len(t) >= len(s) && string(t[:len(s)]) == s {
			return true
		}
	}
	return false
}
